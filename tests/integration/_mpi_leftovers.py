"""Open MPI's shared-memory files that an aborted or killed job leaves in /dev/shm.

Open MPI's shared-memory transport backs each node's segment with a file
``/dev/shm/sm_segment.<host>.<uid>.<jobid>.<n>`` (older releases: ``vader_segment.*``) and
unlinks it at MPI_Finalize; a job whose ranks were killed or called MPI_Abort never does, nor
(Open MPI 5) a singleton, a process that initialised MPI without mpirun: each such run leaks
16 MiB files. ``OpenMpiLeftovers`` takes a snapshot before a job
and, after it, removes the files the job created: new since the snapshot, named as Open MPI
names them, owned by this user, and no longer open or mapped by any process (their job is
gone; a file another job still uses is left alone).
"""

from __future__ import annotations

import os
import re
import signal

from ringtorch.testing import wait_for

SHM = "/dev/shm"
_OPEN_MPI_SEGMENT = re.compile(r"^(sm_segment|vader_segment)\.[^/]+\.\d+\.[0-9a-f]+\.\d+$")


def open_mpi_segments() -> set[str]:
    """Names of the Open MPI segment files in /dev/shm that this user owns."""
    names = set()
    for name in os.listdir(SHM):
        if _OPEN_MPI_SEGMENT.match(name):
            try:
                if os.stat(os.path.join(SHM, name)).st_uid == os.getuid():
                    names.add(name)
            except FileNotFoundError:
                continue
    return names


def in_use(names: set[str]) -> set[str]:
    """The files of ``names`` that some live process has open or mapped."""
    paths = {os.path.join(SHM, name): name for name in names}
    used = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read()
            fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # gone, or not ours to read
            continue
        for path, name in paths.items():
            if path in maps or path in fds:
                used.add(name)
    return used


def session_members(sid: int) -> list[int]:
    """Live processes of session ``sid`` (a launcher started with start_new_session=True)."""
    members = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            members.append(int(pid))
    return members


def end_session(sid: int, grace_s: float = 10.0) -> None:
    """Wait until the launcher's session has no live process left; kill what remains after
    ``grace_s`` (a rank Open MPI did not reap would keep its segment mapped)."""
    try:
        wait_for(lambda: not session_members(sid), grace_s, "the launcher's session to end")
    except TimeoutError:
        pass  # what is left is killed now
    for pid in session_members(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class OpenMpiLeftovers:
    """Snapshot /dev/shm before a job; ``clean()`` after it removes what the job left."""

    def __init__(self) -> None:
        self.before = open_mpi_segments()

    def left(self) -> set[str]:
        """Segment files created since the snapshot that no live process uses."""
        new = open_mpi_segments() - self.before
        return new - in_use(new)

    def clean(self) -> set[str]:
        """Remove the files left() names; returns their names."""
        removed = set()
        for name in self.left():
            try:
                os.unlink(os.path.join(SHM, name))
                removed.add(name)
            except FileNotFoundError:
                pass
        return removed

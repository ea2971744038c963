"""A guardian process that outlives a SIGKILLed supervisor just long enough to kill its job.

The parent-death signal kills the workers when the launcher dies, but not the workers' own
children (a data loader, a shell pipeline). The guardian is forked from the launcher before it
opens anything; the launcher tells it, through a pipe, each process group it starts and each
one it has finished stopping. When the pipe reaches EOF (the launcher exited, however it
died), the guardian SIGKILLs the groups still on its list, then every process of this user
that carries the job's mark (JOB_MARK_VAR=mark in the environment it was started with, which
the workers get from the launcher and their descendants inherit): that reaches the ones that
left the workers' process groups (``setsid``, double-forked daemons), which a SIGKILLed
launcher could not reap. Not covered: a descendant started with an environment scrubbed of
the mark (``env -i``), or running as another user. It ignores the terminal's signals, holds no
other file descriptor, and runs only ``os`` calls.

Pipe messages are ASCII lines: ``+PGID`` (watch this group), ``-PGID`` (it is gone).
"""

from __future__ import annotations

import os
import secrets
import signal

_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

# The variable the launcher sets in its workers' environment; descendants inherit it.
JOB_MARK_VAR = "RINGTORCH_JOB_MARK"
# Rounds of "find every marked process, SIGKILL it": a process that forked between the scan and
# its death is found by the next round; a round that finds nobody ends the sweep.
_SWEEP_ROUNDS = 20


def marked_processes(mark: str) -> list[int]:
    """The pids of this user's processes whose initial environment carries the job mark."""
    needle = f"{JOB_MARK_VAR}={mark}".encode()
    me, found = os.getuid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != me:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return found


def kill_marked(mark: str) -> int:
    """SIGKILL every process of this user carrying ``mark``, round after round, until a scan
    finds none alive; returns how many were killed."""
    killed: set[int] = set()
    for _ in range(_SWEEP_ROUNDS):
        alive = [pid for pid in marked_processes(mark) if not _is_zombie(pid)]
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
    return len(killed)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def _guard(read_fd: int, mark: str) -> None:
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    watched: set[int] = set()
    pending = b""
    while True:
        try:
            chunk = os.read(read_fd, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line[:1] == b"+":
                watched.add(int(line[1:]))
            elif line[:1] == b"-":
                watched.discard(int(line[1:]))
    for pgid in watched:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    kill_marked(mark)


class Guardian:
    """The launcher's handle on its guardian process. Create it before opening anything else.

    Attributes:
        mark: this job's mark; put ``JOB_MARK_VAR=mark`` in every worker's environment.
    """

    def __init__(self) -> None:
        self.mark = f"{os.getpid()}-{secrets.token_hex(8)}"
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the guardian: keep only the read end, then guard
            try:
                os.closerange(3, read_fd)
                os.closerange(read_fd + 1, 65536)
                _guard(read_fd, self.mark)
            finally:
                os._exit(0)
        os.close(read_fd)
        self.pid = pid
        self._write_fd: int | None = write_fd
        os.set_inheritable(write_fd, False)

    def _send(self, line: str) -> None:
        if self._write_fd is not None:
            os.write(self._write_fd, line.encode() + b"\n")

    def watch(self, pgid: int) -> None:
        """Kill group ``pgid`` if the launcher dies before calling :meth:`release`."""
        self._send(f"+{pgid}")

    def release(self, pgid: int) -> None:
        """Group ``pgid`` is gone; forget it (its number may be reused)."""
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Let the guardian exit (every group it still watches is killed) and reap it."""
        if self._write_fd is None:
            return
        os.close(self._write_fd)
        self._write_fd = None
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


__all__ = ["JOB_MARK_VAR", "Guardian", "kill_marked", "marked_processes"]

"""Named shared-memory files for the simulated runtime's IPC (device buffers, interprocess
events): POSIX shared memory in ``/dev/shm`` (the temporary folder where there is none),
created exclusively with mode 0600. Plain files and mmap rather than
``multiprocessing.shared_memory``, whose resource tracker would unlink a segment when a
process that merely opened it exits (Python < 3.13). Rule kept: only the creator unlinks.
"""

from __future__ import annotations

import mmap
import os
import tempfile


def _folder() -> str:
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def create(nbytes: int, kind: str) -> tuple[str, mmap.mmap]:
    """A new zero-filled segment of at least one byte; returns its name and its mapping."""
    name = f"ringtorch-sim-{kind}-{os.getpid()}-{os.urandom(8).hex()}"
    path = os.path.join(_folder(), name)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, max(nbytes, 1))
        return path, mmap.mmap(fd, max(nbytes, 1))
    finally:
        os.close(fd)


def attach(path: str) -> mmap.mmap:
    """Map a peer's segment (whole)."""
    if not os.path.basename(path).startswith("ringtorch-sim-"):
        raise ValueError(f"not a simulated device segment: {path!r}")
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def unlink(path: str) -> None:
    """Remove the name (mappings stay valid until they are dropped)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

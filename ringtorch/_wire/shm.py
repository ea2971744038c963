"""Shared-memory segments for ranks on one host: create, map, grow, probe the owner, clean up.

A segment is a file in ``/dev/shm`` (mode 0600, a random 128-bit name) that one rank creates
and writes its signals and staged data into; its peers map it read-write and read from it.
The rule this module keeps: **no segment outlives the job**. The creator holds an exclusive
``flock`` on the file for as long as it lives, and unlinks the name as soon as every peer has
mapped it (the memory then lives only as long as the mappings; the kernel frees it when the
last process holding one exits, however it exits). The file is made under a temporary name
(``TMP_PREFIX``, with the creator's pid), locked, reserved, and only then renamed to its
segment name, so a segment name is locked for as long as its creator lives: an unlocked one is
garbage, whatever its age. A name left behind by a rank killed between creating and
unlinking is removed by :func:`sweep_stale_segments`, which the launcher runs when its job
ends and every rank runs when it creates a segment.

The same lock tells peers whether the owner is alive: a process's locks are released by the
kernel when it dies (even by SIGKILL), so a peer whose non-blocking shared lock on the owner's
file succeeds knows the owner is gone (:meth:`Segment.owner_alive`). This works across pid
namespaces and sees a killed process that its parent has not reaped yet.

Knows bytes, never tensors: the layout of the header is in ``shm_domain.py``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import platform
import secrets
import time
import weakref

SHM_DIR = "/dev/shm"
NAME_PREFIX = "ringtorch_"
TMP_PREFIX = "ringtorch~"  # + creator pid + "_" + random: a segment not yet locked and renamed
PAGE = mmap.PAGESIZE

# Weak set of segments this process owns; a forked child closes its inherited copy of each
# owner's locked descriptor, so that a child (a DataLoader worker, say) does not keep the
# owner's lock alive after the owner dies. (The lock is held on a descriptor of its own,
# never the mapped one, because mmap keeps a duplicate of the mapped descriptor.)
_owned: weakref.WeakSet[Segment] = weakref.WeakSet()


def _close_owned_lock_fds_in_child() -> None:
    for segment in list(_owned):
        segment._forget_fd_after_fork()


os.register_at_fork(after_in_child=_close_owned_lock_fds_in_child)


def shm_supported() -> str:
    """Empty when this machine can run the shared-memory protocol, else the reason it cannot.

    The protocol publishes data with ordinary stores and then a sequence word; a reader that
    sees the word sees the data only on a CPU that keeps stores in order (x86-64's TSO).
    Python has no memory fence to make that true elsewhere, so other CPUs use sockets.
    """
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64", "i386", "i686"):
        return f"the shared-memory protocol needs x86's store ordering; this CPU is {machine}"
    if not os.path.isdir(SHM_DIR) or not os.access(SHM_DIR, os.W_OK):
        return f"{SHM_DIR} is not a writable directory"
    return ""


def new_segment_name() -> str:
    """A fresh segment name: the prefix, the creator's pid and 128 random bits."""
    return f"{NAME_PREFIX}{os.getpid()}_{secrets.token_hex(16)}"


class Segment:
    """One mapped shared-memory file. Create with :meth:`create` or :meth:`attach`.

    Attributes:
        name: the file name in ``/dev/shm`` (it may already be unlinked).
        size: bytes currently mapped.
        buf: a memoryview of the mapping; replaced by :meth:`grow` and :meth:`remap`.
        owner: True in the creating process.
    """

    def __init__(self, name: str, fd: int, size: int, owner: bool, lock_fd: int = -1) -> None:
        self.name = name
        self.owner = owner
        self._fd = fd
        self._lock_fd = lock_fd
        self.size = 0
        self.buf = memoryview(b"")
        self._map: mmap.mmap | None = None
        self._linked = owner
        self._map_to(size)
        if owner:
            _owned.add(self)

    @classmethod
    def create(cls, nbytes: int) -> Segment:
        """Create, lock, reserve and map a new segment of ``nbytes`` (rounded up to pages).

        The memory is reserved with ``posix_fallocate``, so a full ``/dev/shm`` fails here with
        ``OSError(ENOSPC)`` instead of killing the process with SIGBUS on first touch.
        """
        name = new_segment_name()
        path = os.path.join(SHM_DIR, name)
        current = os.path.join(SHM_DIR, f"{TMP_PREFIX}{os.getpid()}_{secrets.token_hex(8)}")
        lock_fd = os.open(current, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        fd = -1
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # the mapping gets its own open file: mmap duplicates the descriptor it maps, and a
            # forked child holding a duplicate of the *locked* one would keep the lock alive
            fd = os.open(current, os.O_RDWR | os.O_CLOEXEC)
            size = _round_up(nbytes, PAGE)
            os.posix_fallocate(fd, 0, size)
            os.rename(current, path)  # the segment name appears locked, reserved, full size
            current = path
            return cls(name, fd, size, owner=True, lock_fd=lock_fd)
        except BaseException:
            for each in (fd, lock_fd):
                if each >= 0:
                    os.close(each)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(current)
            raise

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map a peer's segment by name (before the owner unlinks it).

        Raises:
            PermissionError: the file belongs to another user (a segment is only ever shared
                between processes of one user).
            ValueError: the name is not a ringtorch segment name.
        """
        if not name.startswith(NAME_PREFIX) or "/" in name:
            raise ValueError(f"{name!r} is not a ringtorch shared-memory segment name")
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid():
                raise PermissionError(
                    f"shared-memory segment {name} belongs to uid {st.st_uid}, not to this "
                    f"process's uid {os.getuid()}; refusing to map it")
            return cls(name, fd, st.st_size, owner=False)
        except BaseException:
            os.close(fd)
            raise

    def _map_to(self, size: int) -> None:
        """Map ``size`` bytes; the previous mapping is released once nothing views it."""
        new_map = mmap.mmap(self._fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        old = self._map
        self._map, self.size, self.buf = new_map, size, memoryview(new_map)
        if old is not None:
            with contextlib.suppress(BufferError):  # views still exist: the GC unmaps it later
                old.close()

    def grow(self, nbytes: int) -> bool:
        """Owner only: extend the file to ``nbytes`` (rounded up to pages) and remap it.

        Returns False, leaving the segment as it was, when the memory cannot be reserved
        (``/dev/shm`` full); callers then keep working within the old size.
        """
        assert self.owner, "only the owner grows a segment"
        size = _round_up(nbytes, PAGE)
        if size <= self.size:
            return True
        try:
            os.posix_fallocate(self._fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                raise
            os.ftruncate(self._fd, self.size)
            return False
        self._map_to(size)
        return True

    def remap(self) -> None:
        """Peer side: map the file's current size, after its owner grew it."""
        size = os.fstat(self._fd).st_size
        if size > self.size:
            self._map_to(size)

    def owner_alive(self) -> bool:
        """Peer side: whether the creating process still lives (it holds the file's lock)."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        return False

    def unlink(self) -> None:
        """Owner: remove the name; the memory stays until every mapping is gone."""
        if self.owner and self._linked:
            self._linked = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(SHM_DIR, self.name))

    def close(self) -> None:
        """Unmap and close; the owner also unlinks. Idempotent."""
        self.unlink()
        with contextlib.suppress(BufferError):  # views built on it keep the memory alive
            self.buf.release()
        self.buf = memoryview(b"")
        if self._map is not None:
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
        for fd in (self._fd, self._lock_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._lock_fd = -1
        _owned.discard(self)

    def _forget_fd_after_fork(self) -> None:
        if self._lock_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd = -1
            self._linked = False  # the child does not own the name either
            self.owner = False

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _still_being_made(name: str, ctime: float, min_age_s: float) -> bool:
    """Whether a temporary name may belong to a creator that has not locked it yet: younger
    than ``min_age_s`` and its creator's pid (in the name) not known to be gone."""
    if time.time() - ctime >= min_age_s:
        return False
    try:
        os.kill(int(name[len(TMP_PREFIX):].split("_", 1)[0]), 0)
    except ProcessLookupError:
        return False
    except (ValueError, OverflowError, PermissionError):
        pass  # no pid to go by, or another user's process: keep to the age
    return True


def sweep_stale_segments(min_age_s: float = 10.0) -> list[str]:
    """Remove this user's ringtorch segments whose creator is dead; return their names.

    A segment name is locked from the moment it exists until its creator dies, so an unlocked
    one is garbage at any age. A temporary name is unlocked for a moment after its creation:
    it is garbage once unlocked and its creator's pid is gone, or older than ``min_age_s``.
    """
    removed = []
    try:
        names = [n for n in os.listdir(SHM_DIR) if n.startswith((NAME_PREFIX, TMP_PREFIX))]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != os.getuid() or (name.startswith(TMP_PREFIX) and _still_being_made(
                    name, st.st_ctime, min_age_s)):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            removed.append(name)
        finally:
            os.close(fd)
    return removed


def _round_up(n: int, multiple: int) -> int:
    return max(multiple, -(-n // multiple) * multiple)


__all__ = ["NAME_PREFIX", "TMP_PREFIX", "SHM_DIR", "Segment", "new_segment_name", "shm_supported",
           "sweep_stale_segments"]

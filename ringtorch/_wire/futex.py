"""Futex waits on words in shared memory: a sleeping rank is woken when its peer arrives.

A rank that has waited a while for a peer stops spinning and sleeps; with plain naps it wakes
up to a nap late (500 µs), every round, whenever the machine is busy. With a futex the peer's
arrival wakes it at once (25-60 µs on these VMs): the waiter marks the peer's *sleepers* word,
then sleeps on the low 32 bits of the peer's round word (the kernel returns at once if they
changed already); the peer, after storing a new round, wakes the word's sleepers if the mark is
set. A wake can be missed two ways: Python has no memory fence (the waiter's mark and the
waker's round store may pass each other), and the waker clears the mark after reading it, so
a waiter that marks for the next round between the waker's store and its read is cleared
unwoken. Every futex sleep therefore has a timeout (at most the waiter's next liveness check,
1 ms: ringtorch/_wire/shm_wait.py): a missed wake costs that much, never a hang.

Linux x86-64 only (the shared-memory path already requires x86-64's store order); elsewhere
``available`` is False and callers nap.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import sys

_SYS_FUTEX = 202  # x86-64
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1  # shared (not FUTEX_PRIVATE_FLAG): the word is in a file mapping
_WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


def _load() -> object | None:
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint,
                   ctypes.POINTER(_Timespec), ctypes.c_void_p, ctypes.c_int]
    return fn


_syscall = _load()
available = _syscall is not None


def address_of(buf: memoryview, offset: int) -> int:
    """The address of byte ``offset`` of a writable buffer (a mapped segment)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buf)) + offset


def wait(address: int, expected: int, timeout_s: float) -> None:
    """Sleep while the u32 at ``address`` equals ``expected`` (low 32 bits), at most
    ``timeout_s``; returns at once if it differs already. Spurious returns are possible: the
    caller re-checks its condition."""
    if _syscall is None:
        raise OSError(errno.ENOSYS, "futex is not available on this platform")
    sec = int(timeout_s)
    timeout = _Timespec(sec, int((timeout_s - sec) * 1e9))
    _syscall(_SYS_FUTEX, address, _FUTEX_WAIT, expected & 0xFFFFFFFF, ctypes.byref(timeout),
             None, 0)  # 0, or -1 with EAGAIN / ETIMEDOUT / EINTR: all mean "look again"


def wake(address: int) -> None:
    """Wake every process sleeping on the u32 at ``address``."""
    if _syscall is not None:
        _syscall(_SYS_FUTEX, address, _FUTEX_WAKE, _WAKE_ALL, None, None, 0)


__all__ = ["address_of", "available", "wait", "wake"]

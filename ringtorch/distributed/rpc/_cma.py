"""Cross-memory attach: copy a buffer straight out of another process (process_vm_readv).

Between workers of one host, a large tensor is not pushed through the socket (two copies:
into the kernel and out again); its address goes in the message and the receiver copies it
from the sender's memory in one system call, straight into the new tensor's storage. The
sender keeps the memory alive until the receiver is done (the reply for a request; a
RELEASE_HOLD message for a reply).

Linux only, and only where the kernel lets this process read the peer (same user; Yama
ptrace scope and seccomp may forbid it). ``probe`` checks that once per peer at start-up by
reading a known random token from it; where it fails, the socket carries the bytes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
from typing import Any

import numpy as np

MIN_NBYTES = 128 * 1024  # smaller buffers are cheaper to send through the socket


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _load() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                   ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
    return fn


_readv = _load()

# A token other processes read to check that they may read this one.
_TOKEN = (ctypes.c_char * 16).from_buffer_copy(os.urandom(16))


def token() -> dict[str, Any]:
    """Where and what this process's probe token is (published with its address)."""
    return {"addr": ctypes.addressof(_TOKEN), "token": bytes(_TOKEN).hex()}


def address_of(buf: memoryview) -> int:
    """The address of a contiguous buffer's first byte."""
    return int(np.frombuffer(buf, dtype=np.uint8).ctypes.data)


def read_into(pid: int, address: int, dest: np.ndarray) -> None:
    """Fill ``dest`` with the bytes at ``address`` in process ``pid``.

    Raises:
        OSError: the read failed (the process died, or we may not read it).
    """
    if _readv is None:
        raise OSError(errno.ENOSYS, "process_vm_readv is not available")
    base = int(dest.ctypes.data)
    done, total = 0, dest.nbytes
    while done < total:
        local = _IoVec(base + done, total - done)
        remote = _IoVec(address + done, total - done)
        n = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n <= 0:
            err = ctypes.get_errno() if n < 0 else errno.EIO
            raise OSError(err, f"process_vm_readv from pid {pid} failed: {os.strerror(err)}")
        done += n


def probe(pid: int, published: dict[str, Any] | None) -> bool:
    """Whether this process can read process ``pid``'s memory (its published token)."""
    if _readv is None or not published or pid == os.getpid():
        return False
    dest = np.empty(16, dtype=np.uint8)
    try:
        read_into(pid, int(published["addr"]), dest)
    except OSError:
        return False
    return dest.tobytes().hex() == published["token"]

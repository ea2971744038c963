"""Tie a child's life to its supervisor's: the parent-death signal and the subreaper flag.

A worker must not outlive the process that started it, even when that process is killed
with SIGKILL and runs no cleanup at all. Linux's ``prctl(PR_SET_PDEATHSIG, sig)`` makes the
kernel send ``sig`` to a child when the thread that forked it dies, so workers are always
started from the supervisor's main thread. ``prctl(PR_SET_CHILD_SUBREAPER)`` makes a
supervisor adopt its orphaned descendants (a worker's child whose parent died), so that
teardown can find and kill them instead of leaving them to init. Both are Linux-only; on
other systems the calls report False and the process-group teardown still applies.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_prctl: Callable[..., int] | None = None
if sys.platform.startswith("linux"):
    try:
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
        _prctl.restype = ctypes.c_int
    except (OSError, AttributeError):  # pragma: no cover - a libc without prctl
        _prctl = None


def set_parent_death_signal(sig: int, expected_parent: int | None = None) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent thread dies.

    ``expected_parent`` closes the race where the parent died before the call: if the
    parent pid is no longer the expected one, the death already happened and this process
    exits at once (with code 1), as the signal would have made it.

    Returns:
        True when the signal is armed, False where prctl does not exist.
    """
    if _prctl is None:
        return False
    if _prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0) != 0:
        return False
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)
    return True


def death_signal_preexec(sig: int) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen`` that arms ``sig`` as the parent-death signal.

    It runs in the forked child before ``exec`` and only calls prctl and getppid, so it takes
    no lock another thread of the parent could have held at fork time. The signal survives
    ``exec`` (except into set-uid programs).
    """
    parent = os.getpid()

    def arm() -> None:
        set_parent_death_signal(sig, expected_parent=parent)

    return arm


def become_subreaper() -> bool:
    """Make this process adopt its orphaned descendants (they are reparented here, not to init).

    Returns:
        True when set, False where prctl does not exist.
    """
    if _prctl is None:
        return False
    return _prctl(PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(1), 0, 0, 0) == 0


__all__ = ["become_subreaper", "death_signal_preexec", "set_parent_death_signal"]

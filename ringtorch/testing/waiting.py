"""``wait_for``: order a test's events by waiting on state, never by sleeping.

A test that needs "the receive is posted" or "rank 1 is inside the collective" before it
goes on waits for what says so (a ``statistics()`` record, a store key, a marker file)
instead of sleeping for a guessed time: the wait ends as soon as the state holds, and when it
never does, the failure says what was awaited.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, what: str = "", *,
             interval: float = 0.001) -> T:
    """Return ``predicate()``'s first truthy value, polling it every ``interval`` seconds
    (a millisecond; longer where reading the state costs the process under test time it is
    being measured on).

    Raises:
        TimeoutError: it was not truthy within ``timeout`` seconds; the message names
            ``what`` (or the predicate) and its last value.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"waited {timeout} s for {what or predicate!r}; last value "
                               f"{value!r}")
        time.sleep(interval)


def wait_for_thread_in(thread: threading.Thread, *functions: str, timeout: float = 10.0) -> None:
    """Return once ``thread`` runs inside one of ``functions`` (Python function names on its
    stack), e.g. a store client's reply reader: the request went out and the thread waits.

    The threads' equivalent of trio's ``wait_all_tasks_blocked``, for a blocking call whose
    object keeps no record of its waiters.

    Raises:
        TimeoutError: the thread was not seen there within ``timeout`` seconds.
    """
    def inside() -> bool:
        frame = sys._current_frames().get(thread.ident or -1)
        while frame is not None:
            if frame.f_code.co_name in functions:
                return True
            frame = frame.f_back
        return False

    wait_for(inside, timeout, f"thread {thread.name} to be inside {list(functions)}")


@contextmanager
def frozen(pid_file: Path, what: str, timeout: float = 60.0) -> Iterator[int]:
    """Stop (SIGSTOP) the process whose pid ``pid_file`` holds for the body of the block,
    and continue it (SIGCONT) when the block ends, however it ends: a rank frozen as a
    debugger or a stuck C call would leave it. The file is waited for (``what`` names it in
    the timeout's message); it must be written whole at once (write, then rename).

    Yields:
        The frozen process's pid.
    """
    wait_for(pid_file.exists, timeout, what)
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)


__all__ = ["frozen", "wait_for", "wait_for_thread_in"]

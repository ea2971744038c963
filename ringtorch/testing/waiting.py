"""``wait_for``: order a test's events by waiting on state, never by sleeping.

A test that needs "the receive is posted" or "rank 1 is inside the collective" before it
goes on waits for what says so (a ``statistics()`` record, a store key, a marker file)
instead of sleeping for a guessed time: the wait ends as soon as the state holds, and when it
never does, the failure says what was awaited.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, what: str = "") -> T:
    """Return ``predicate()``'s first truthy value, polling it every millisecond.

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
        time.sleep(0.001)


__all__ = ["wait_for"]

"""AbortState: why a group was aborted, decided once, with a condition to wait on.

Every detector of a failure posts its cause here: a reader thread that sees a peer's EOF or
an ABORT frame, a shared-memory wait that finds a peer dead or aborted, a timeout, a
mismatch, the user's ``abort()``. The first post wins and is the cause every later call
reports; later posts are ignored. A rank whose own connection broke may only be a victim of
another rank's failure (whose ABORT frame, carrying the real cause, a reader thread is about
to read): it waits on the condition, with a bound, for a cause to arrive before it posts its
own. Nothing here sleeps or polls.
"""

from __future__ import annotations

import threading


class AbortState:
    """First-cause-wins abort record of one group (see the module docstring).

    Attributes:
        cause: the first cause posted, or None while the group is healthy. Read without a
            lock on the hot path (a single attribute read).
    """

    __slots__ = ("cause", "_cond")

    def __init__(self) -> None:
        self.cause: str | None = None
        self._cond = threading.Condition(threading.Lock())

    def post(self, cause: str) -> bool:
        """Record ``cause`` if no cause was posted before; returns whether it was first.
        Safe from any thread; wakes every :meth:`wait`."""
        with self._cond:
            if self.cause is not None:
                return False
            self.cause = cause
            self._cond.notify_all()
            return True

    def wait(self, timeout: float) -> str | None:
        """The cause, waiting up to ``timeout`` seconds for one to be posted (None if none
        came)."""
        if self.cause is not None or timeout <= 0:
            return self.cause
        with self._cond:
            self._cond.wait_for(lambda: self.cause is not None, timeout)
            return self.cause


__all__ = ["AbortState"]

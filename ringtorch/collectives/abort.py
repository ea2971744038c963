"""AbortState: why a group was aborted, decided once, with a condition to wait on.

Every detector of a failure posts its cause here: a reader thread that sees a peer's EOF or
an ABORT frame, a shared-memory wait that finds a peer dead or aborted, a timeout, a
mismatch, the user's ``abort()``. The first post wins and is the cause every later call
reports; later posts are ignored. A rank whose own connection broke may only be a victim of
another rank's failure (whose ABORT frame, carrying the real cause, a reader thread is about
to read): it waits on the condition, with a bound, for a cause to arrive before it posts its
own. A cause that is a lost connection (a peer's process exited, or the network to its host
failed) is marked ``lost``: the calls it fails raise ``PeerLostError`` (a
``DistNetworkError``), and the ABORT frames that carry it say so, so that every rank raises
the same class. Nothing here sleeps or polls.
"""

from __future__ import annotations

import threading


class AbortState:
    """First-cause-wins abort record of one group (see the module docstring).

    Attributes:
        cause: the first cause posted, or None while the group is healthy. Read without a
            lock on the hot path (a single attribute read).
        lost: whether that cause is a lost connection (see the module docstring).
    """

    __slots__ = ("cause", "lost", "_cond")

    def __init__(self) -> None:
        self.cause: str | None = None
        self.lost = False
        self._cond = threading.Condition(threading.Lock())

    def post(self, cause: str, lost: bool = False) -> bool:
        """Record ``cause`` (``lost``: it is a lost connection) if no cause was posted
        before; returns whether it was first. Safe from any thread; wakes every
        :meth:`wait`."""
        with self._cond:
            if self.cause is not None:
                return False
            self.lost = lost
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

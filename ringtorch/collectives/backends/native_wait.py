"""The native backend's long waits: the stall warning, the timeout, and what is asked ahead
of the deadline so that the timeout raises at the deadline itself.

A wait that finishes within a slice (``WAIT_SLICE_S``) never comes here: the socket waits call
``slow_wait`` only after a silent slice, the shared-memory waits call ``shm_poll`` only once
they sleep. From then on the rule is that no rank raises later than its deadline: the wait's
next slice ends at the next thing due (the status query, the hang report's start, a stall
warning, the deadline), the peers are asked where they are ``STATUS_WAIT_S`` before the
deadline (a frozen peer's silence is known by then), and the hang report is begun ahead of it
(``HangState.report_ahead``) so that it is complete when the error is raised.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ringtorch._observe.hang_ask import HANG
from ringtorch._wire import mailbox as mb
from ringtorch._wire.errors import PeerClosedError
from ringtorch.collectives.abort import AbortState
from ringtorch.collectives.backends.native_status import STATUS_WAIT_S, StatusBoard
from ringtorch.collectives.call import CollectiveCall
from ringtorch.collectives.reports import Words

# the stall warnings keep the backend's logger name (what users filter on)
log = logging.getLogger("ringtorch.collectives.backends.native")
# the shortest a wait sleeps between two calls of its slow hook (poll's millisecond)
_MIN_WAKE_S = 0.001


class DeadlinePassed(Exception):
    """Raised inside a wait when the collective's deadline passed; carries the message."""


class WaitWatch:
    """The slow path of one backend's waits (see the module docstring).

    Attributes:
        mailbox: the group's Mailbox (status queries); None in a group of one.
        transport: the group's Transport (its ``socket_deadline``); set once it is open.
    """

    def __init__(self, board: StatusBoard, words: Words, abort_state: AbortState, rank: int,
                 size: int) -> None:
        self.mailbox: mb.Mailbox | None = None
        self.transport: Any = None
        self._board = board
        self._words = words
        self._abort = abort_state
        self._peers = [p for p in range(size) if p != rank]

    def slow_wait(self, peers: list[int], waited: float) -> float | None:
        """A socket wait's slow hook (PeerMesh.on_slow_wait): raise at the deadline, warn
        while stalled, ask ahead of the deadline; returns when to be called again."""
        board = self._board
        call = board.call
        if call is None or not board.running or self.transport is None:
            return None
        now = time.monotonic()
        if self._abort.cause is not None:  # aborted meanwhile (another rank timed out)
            raise PeerClosedError("the group was aborted while this rank waited")
        deadline = self.transport.socket_deadline(call)
        if now >= deadline:
            report = self._missing_report(call.seq, peers, now)
            if self._abort.cause is not None:  # another rank's abort beat ours
                raise PeerClosedError("the group was aborted while this rank waited")
            raise DeadlinePassed(self._words.timed_out(call, now - board.start, report))
        warn = now - board.start >= board.warning_after()
        if warn:  # again at twice the wait each time
            board.warned(now)
        due = self._ahead(call, now, True)
        if warn:  # its query waits for answers until the next thing due at most
            report = self._missing_report(call.seq, peers, min(due, deadline))
            log.warning("%s", self._words.stalled(call, now - board.start, report))
            due = self._ahead(call, time.monotonic(), True)
        return max(_MIN_WAKE_S, min(due, deadline) - time.monotonic())

    def shm_poll(self) -> str | None:
        """The shared-memory waits' poll (every millisecond of a long wait): the group's
        abort cause, and the hang report begun ahead of the deadline."""
        cause = self._abort.cause
        board = self._board
        call = board.call
        if cause is None and call is not None and board.running:
            now = time.monotonic()
            if 2 * now >= board.start + call.deadline:  # nothing is due before half the timeout
                self._ahead(call, now, False)
        return cause

    def _ahead(self, call: CollectiveCall, now: float, sockets: bool) -> float:
        """What is due ahead of ``call``'s deadline: the peers' status (``sockets``: the
        shared-memory path reads it from the segments) and the hang report's start. Returns
        when the next such thing, or stall warning, is due."""
        group = self._words.group
        return self._board.ahead(
            call, now, HANG.lead_s(), self.mailbox if sockets else None, self._peers,
            lambda: HANG.report_ahead(group, call.seq, call.deadline))

    def _missing_report(self, seq: int, waiting_on: list[int], until: float) -> str:
        """Where every peer is (status frames answered by its reader thread): at the
        deadline (``until`` <= now), the answers to the query made ahead of it; for a stall
        warning, a fresh query awaited until ``until`` at most (or a second)."""
        assert self.mailbox is not None
        now = time.monotonic()
        if until <= now:
            statuses = self._board.at_deadline(self.mailbox, self._peers, now)
        else:
            statuses = self._board.query(self.mailbox, self._peers,
                                         min(STATUS_WAIT_S, until - now))
        return self._words.missing(seq, statuses, self._peers, waiting_on)


__all__ = ["DeadlinePassed", "WaitWatch"]

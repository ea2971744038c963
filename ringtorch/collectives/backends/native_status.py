"""The native backend's answers to "where are you?" (kept here so native.py reads as the
operations; the arguments were checked by the group, collectives/checks.py).

The StatusBoard points at this rank's current collective (its Operation, running or
finished), answered to a peer's STATUS_REQ frame by the p2p reader thread, so a timeout message
can say where every rank is without the store and without the missing rank's main thread.
What is due ahead of a collective's deadline is that operation's own (``Ahead``, kept on it
as ``o.ahead``): the board keeps no per-call state but the pointer, and the peers' answers.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from ringtorch import _config
from ringtorch._observe.operation import Operation
from ringtorch._wire import mailbox as mb
from ringtorch.collectives.call import CollectiveCall, status_record

# How long before its deadline a waiting collective asks the others where they are, so that
# at the deadline the late rank is already known (a frozen rank never answers): the answers
# of live ranks come within milliseconds, and a query never holds a wait past its next event.
STATUS_WAIT_S = 1.0
# At the deadline, answers still missing from a query sent late (a timeout shorter than two
# slices) are waited for this long at most.
LATE_ANSWERS_S = 0.1


class Ahead:
    """What is due ahead of one collective's deadline, kept on its operation (``o.ahead``),
    made the first time one of its waits is slow: ``time.monotonic()`` of the status query
    and of the hang report's start (0.0: done or never), and of the last query sent while it
    ran (0.0: none)."""

    __slots__ = ("status_at", "report_at", "asked_at")

    def __init__(self, status_at: float, report_at: float) -> None:
        self.status_at = status_at
        self.report_at = report_at
        self.asked_at = 0.0


class StatusBoard:
    """This rank's progress, and the answers peers gave to our status queries.

    Ahead of a waiting collective's deadline (``ahead``, called from the slow path of waits
    only, so a collective that finishes in time pays nothing): at ``deadline - STATUS_WAIT_S``
    the peers are asked where they are, and at ``deadline - report lead`` the hang report is
    begun (``on_report``), both at most half the timeout ahead."""

    def __init__(self) -> None:
        # The current or last collective: its operation (the call, start stamp, next stall
        # warning and what is due ahead of its deadline are the operation's; the board only
        # points at it).
        self.op: Operation | None = None
        self.running = False
        self._cond = threading.Condition()
        self._answers: dict[int, dict[str, Any]] = {}

    @property
    def call(self) -> CollectiveCall | None:
        """The current or last collective's CollectiveCall."""
        op = self.op
        return None if op is None else op.call

    @property
    def start(self) -> float:
        """``time.monotonic()`` when the current collective started."""
        op = self.op
        return 0.0 if op is None else op.started

    def warning_after(self) -> float:
        """Seconds after its start at which the current collective's next stall warning is
        due. RINGTORCH_STALL_WARNING_S is read here, on first need, and not as each
        collective starts: reading the environment costs more than a short collective's
        whole bookkeeping, and most collectives never wait long enough to ask."""
        op = self.op
        assert op is not None
        if op.warn_after < 0:
            op.warn_after = _config.STALL_WARNING_S.get()
        return op.warn_after

    def warned(self, now: float) -> None:
        """A stall warning was just given: the next one is due at twice the wait."""
        op = self.op
        assert op is not None
        op.warn_after = 2 * (now - op.started)

    def answer(self, mailbox: mb.Mailbox, peer: int) -> None:
        """Reply to ``peer``'s query off the reader thread (readers never send)."""
        payload = json.dumps(status_record(self.call, self.running)).encode()
        threading.Thread(target=mailbox.send_control, args=(peer, mb.STATUS, payload),
                         daemon=True, name="ringtorch-status-reply").start()

    def on_status(self, peer: int, payload: bytes) -> None:
        with self._cond:
            self._answers[peer] = json.loads(payload)
            self._cond.notify_all()

    def ask(self, mailbox: mb.Mailbox, peers: list[int]) -> float:
        """Ask ``peers`` where they are, without waiting (the answers are kept); returns when
        it asked (kept on the current collective's schedule, when it has one)."""
        with self._cond:
            self._answers.clear()
        asked = time.monotonic()
        plan = getattr(self.op, "ahead", None)
        if plan is not None:
            plan.asked_at = asked
        for peer in peers:
            mailbox.send_control(peer, mb.STATUS_REQ, b"", 0.2)
        return asked

    def collect(self, peers: list[int], until: float) -> dict[int, dict[str, Any]]:
        """The answers to the last ``ask``, waiting for the missing ones until ``until``."""
        with self._cond:
            while len(self._answers) < len(peers) and time.monotonic() < until:
                self._cond.wait(max(0.0, until - time.monotonic()))
            return dict(self._answers)

    def query(self, mailbox: mb.Mailbox, peers: list[int],
              wait_s: float = STATUS_WAIT_S) -> dict[int, dict[str, Any]]:
        """Ask ``peers`` where they are; returns the answers that came within ``wait_s``."""
        self.ask(mailbox, peers)
        return self.collect(peers, time.monotonic() + wait_s)

    def at_deadline(self, mailbox: mb.Mailbox, peers: list[int],
                    now: float) -> dict[int, dict[str, Any]]:
        """Where the peers are, at the current collective's deadline: the answers to the
        query made ahead of it (asked now, and awaited ``LATE_ANSWERS_S``, if none was)."""
        plan = getattr(self.op, "ahead", None)
        asked = 0.0 if plan is None else plan.asked_at
        if not asked:
            asked = self.ask(mailbox, peers)
        return self.collect(peers, min(asked + STATUS_WAIT_S, now + LATE_ANSWERS_S))

    def ahead(self, call: CollectiveCall, now: float, report_lead_s: float | None,
              mailbox: mb.Mailbox | None, peers: list[int],
              on_report: Callable[[], None]) -> float:
        """Do what is due ahead of ``call``'s deadline (the current collective's: the status
        query, when ``mailbox`` is given; the hang report's start, when ``report_lead_s``
        is); returns the next moment one of them or the next stall warning is due."""
        op = self.op
        assert op is not None
        plan: Ahead | None = getattr(op, "ahead", None)
        if plan is None:
            half = (call.deadline - op.started) / 2
            plan = op.ahead = Ahead(
                call.deadline - min(STATUS_WAIT_S, half) if mailbox else 0.0,
                call.deadline - min(report_lead_s, half) if report_lead_s is not None else 0.0)
        if plan.report_at and now >= plan.report_at:
            plan.report_at = 0.0
            on_report()
        if plan.status_at and now >= plan.status_at:
            plan.status_at = 0.0
            assert mailbox is not None
            self.ask(mailbox, peers)
        due = [t for t in (plan.status_at, plan.report_at) if t]
        return min([op.started + self.warning_after(), *due])


__all__ = ["LATE_ANSWERS_S", "STATUS_WAIT_S", "Ahead", "StatusBoard"]

"""What a waiting collective does ahead of its deadline (StatusBoard.ahead, called from the
slow path of waits): the hang report begins ``lead`` seconds before the deadline and the
peers are asked where they are ``STATUS_WAIT_S`` before it, each at most half the timeout
ahead and once per collective; the returned moment is the next thing due (or the next stall
warning). Times are made up: the board is given an operation started at 100 s and a clock value per call."""

from __future__ import annotations

from typing import Any

import pytest

from ringtorch._observe.operation import COLLECTIVE, Operation
from ringtorch.collectives.backends.native_status import STATUS_WAIT_S, StatusBoard
from ringtorch.collectives.call import facade_call


class Mailbox:
    """Records the status requests sent (the board's only use of a mailbox here)."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def send_control(self, peer: int, kind: Any, payload: bytes, timeout: float) -> None:
        self.sent.append(peer)


def _board(timeout_s: float, warn_after: float = 1000.0) -> tuple[StatusBoard, Any]:
    o = Operation(COLLECTIVE, "g", "allreduce")
    o.started = 100.0
    o.warn_after = warn_after
    call = o.call = facade_call("allreduce", 7, "g", 100.0 + timeout_s)
    board = StatusBoard()
    board.op = o
    board.running = True
    return board, call


@pytest.mark.parametrize("timeout_s, lead_s, report_at, status_at", [
    (20.0, 4.0, 116.0, 120.0 - STATUS_WAIT_S),   # the report's lead, the status query's
    (3.0, 4.0, 101.5, 103.0 - min(STATUS_WAIT_S, 1.5)),   # at most half the timeout ahead
    (1.0, 4.0, 100.5, 100.5),
])
def test_the_report_and_the_status_query_begin_ahead_of_the_deadline_once(
        timeout_s: float, lead_s: float, report_at: float, status_at: float) -> None:
    board, call = _board(timeout_s)
    mailbox, reports = Mailbox(), []
    due = board.ahead(call, 100.2, lead_s, mailbox, [1, 2], lambda: reports.append(1))
    assert (due, reports, mailbox.sent) == (min(report_at, status_at), [], [])
    due = board.ahead(call, report_at, lead_s, mailbox, [1, 2], lambda: reports.append(1))
    assert reports == [1]
    assert mailbox.sent == ([1, 2] if status_at == report_at else [])
    assert due == (1100.0 if status_at == report_at else status_at)  # then the next warning
    board.ahead(call, status_at, lead_s, mailbox, [1, 2], lambda: reports.append(1))
    board.ahead(call, 100.0 + timeout_s, lead_s, mailbox, [1, 2], lambda: reports.append(1))
    assert reports == [1] and mailbox.sent == [1, 2]


def test_without_reports_or_a_mailbox_only_the_stall_warning_is_due() -> None:
    board, call = _board(20.0, warn_after=5.0)
    due = board.ahead(call, 101.0, None, None, [1], lambda: pytest.fail("no report"))
    assert due == 105.0


def test_a_new_collective_starts_its_own_schedule() -> None:
    board, first = _board(20.0)
    mailbox, reports = Mailbox(), []
    board.ahead(first, 119.5, 4.0, mailbox, [1], lambda: reports.append(first.seq))
    o = Operation(COLLECTIVE, "g", "allreduce")
    o.started = 200.0
    second = o.call = facade_call("allreduce", 8, "g", 220.0)
    board.op = o
    assert board.ahead(second, 201.0, 4.0, mailbox, [1],
                       lambda: reports.append(second.seq)) == 216.0
    board.ahead(second, 220.0 - STATUS_WAIT_S, 4.0, mailbox, [1],
                lambda: reports.append(second.seq))
    assert reports == [7, 8] and mailbox.sent == [1, 1]

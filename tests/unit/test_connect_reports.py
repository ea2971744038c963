"""When a connection that nobody accepts yet is reported: after 1 s, then each time the wait
has doubled, then once a minute (sockets.next_report_s)."""

from __future__ import annotations

import pytest

from ringtorch._wire.sockets import next_report_s


@pytest.mark.parametrize(("waited_s", "next_at"), [
    (0.0, 1.0),      # nothing reported in the first second: a server starting is normal
    (0.3, 1.0),
    (1.0, 2.0),      # reported at 1 s: the next when the wait has doubled
    (1.7, 2.0),
    (2.0, 4.0),
    (5.0, 8.0),      # a report missed while one try took long is not made up for
    (16.0, 32.0),
    (32.0, 64.0),
    (64.0, 124.0),   # from here once a minute
    (124.0, 184.0),
    (1800.0, 1804.0),
])
def test_the_next_report_is_due_after_a_doubled_wait_then_every_minute(waited_s: float,
                                                                       next_at: float) -> None:
    assert next_report_s(waited_s) == next_at


def test_reports_over_half_an_hour_are_few() -> None:
    times, waited = [], 0.0
    while (waited := next_report_s(waited)) <= 1800:
        times.append(waited)
    assert times[:8] == [1, 2, 4, 8, 16, 32, 64, 124]
    assert len(times) == 7 + 28  # then 124, 184, ..., 1744

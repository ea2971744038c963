"""AbortState: the first cause posted wins, and a waiter wakes when a cause arrives."""

from __future__ import annotations

import threading
import time

from ringtorch.collectives.abort import AbortState


def test_the_first_cause_wins_and_later_posts_are_ignored():
    state = AbortState()
    assert state.cause is None
    assert state.post("rank 2 closed its connection") is True
    assert state.post("rank 0 timed out") is False
    assert state.cause == "rank 2 closed its connection"
    assert state.wait(5.0) == "rank 2 closed its connection"


def test_whether_the_cause_is_a_lost_connection_comes_with_the_first_cause_only():
    state = AbortState()
    assert state.lost is False
    assert state.post("rank 1 on host 10.0.0.2 is unreachable from rank 0", lost=True)
    assert not state.post("rank 0 timed out", lost=False)
    assert state.lost is True
    healthy_first = AbortState()
    healthy_first.post("mismatched collectives")
    healthy_first.post("rank 2 closed its connection", lost=True)
    assert healthy_first.lost is False


def test_a_waiter_wakes_when_another_thread_posts():
    state = AbortState()
    started = threading.Event()
    got: list[str | None] = []

    def wait() -> None:
        started.set()
        got.append(state.wait(30.0))

    waiter = threading.Thread(target=wait)
    waiter.start()
    started.wait()
    begin = time.monotonic()
    state.post("rank 1 aborted the group: the user gave up")
    waiter.join(30.0)
    assert got == ["rank 1 aborted the group: the user gave up"]
    assert time.monotonic() - begin < 10.0  # woken by the post, not by the 30 s bound


def test_a_wait_without_a_cause_ends_at_its_bound():
    state = AbortState()
    begin = time.monotonic()
    assert state.wait(0.05) is None
    assert time.monotonic() - begin >= 0.05
    assert state.wait(0.0) is None

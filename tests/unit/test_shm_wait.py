"""shm_wait.py: a waiting rank yields only while yielding is cheap, sleeps once a yield shows
the CPU taken (and does not yield again for a while), yields again once that period is over,
and runs its checks while asleep (a failure they find ends the wait).

The peer is a thread writing the round word of an anonymous shared mapping, as a peer process
writes its segment; "the CPU is taken" is a yield that takes long, as it does when the
scheduler runs another task."""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from ringtorch._wire import futex, shm_wait
from ringtorch.testing import wait_for

# the sleeping half of a wait is a futex wait: these tests need it (x86-64 Linux); elsewhere
# waits nap instead, which test_shm_failures covers
NEEDS_FUTEX = pytest.mark.skipif(not futex.available, reason="no futex on this platform")

ROUND, SLEEPERS = 8, 9  # the words' indices in shm_domain.py's header


class Peer:
    """A peer's round and sleepers words, and a thread that signals them as the peer does."""

    def __init__(self) -> None:
        self.area = mmap.mmap(-1, 4096)
        self.words = memoryview(self.area).cast("Q")

    def address(self) -> int:
        return futex.address_of(memoryview(self.area), 8 * ROUND)

    def signal(self, t: int) -> None:
        """Enter round t as shm_domain does: store it, then wake sleepers that announced."""
        self.words[ROUND] = t
        if self.words[SLEEPERS]:
            self.words[SLEEPERS] = 0
            futex.wake(self.address())

    def signal_once_asleep(self, t: int) -> threading.Thread:
        """Signal round t once the waiter announced that it sleeps (no earlier)."""
        def run() -> None:
            wait_for(lambda: self.words[SLEEPERS] == 1, timeout=30, what="the waiter to sleep")
            self.signal(t)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.words.release()


def _no_check(now: float) -> None:
    pass


def _yields(monkeypatch: pytest.MonkeyPatch, each: Callable[[int], None]) -> list[int]:
    """Replace the module's sched_yield by ``each(n)`` (n: its call number); returns the
    list its calls are counted in."""
    calls: list[int] = []

    def fake() -> None:
        calls.append(len(calls))
        each(len(calls))

    monkeypatch.setattr(shm_wait.os, "sched_yield", fake)
    return calls


@NEEDS_FUTEX
def test_a_slow_yield_sends_the_wait_to_sleep_and_later_waits_sleep_without_yielding(
        peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _yields(monkeypatch, lambda n: time.sleep(0.002))  # the CPU went to another task
    # a quiet period that a loaded machine cannot outlast between the two waits below
    monkeypatch.setattr(shm_wait, "QUIET_MIN_S", 60.0)
    budget = shm_wait.YieldBudget()
    thread = peer.signal_once_asleep(1)
    assert shm_wait.wait_round(peer.words, ROUND, SLEEPERS, 1, peer.address, budget, _no_check)
    thread.join(30)
    assert len(calls) == 1  # one slow yield, then sleep
    assert budget.slow_yields == 1 and budget.quiet_until > time.monotonic()
    thread = peer.signal_once_asleep(2)  # within the quiet period: straight to sleep
    assert shm_wait.wait_round(peer.words, ROUND, SLEEPERS, 2, peer.address, budget, _no_check)
    thread.join(30)
    assert len(calls) == 1


def test_after_the_quiet_period_a_wait_yields_again_and_fast_yields_keep_it_awake(
        peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    # a preempted test (loaded machine) must neither end the yield phase nor look slow
    monkeypatch.setattr(shm_wait, "YIELD_PHASE_S", 60.0)
    monkeypatch.setattr(shm_wait, "SLOW_YIELD_S", 1.0)
    budget = shm_wait.YieldBudget()
    budget.slow(time.monotonic() - 1.0)  # a slow yield long ago: its quiet period is over
    assert budget.quiet_s == 2 * shm_wait.QUIET_MIN_S
    calls = _yields(monkeypatch, lambda n: peer.signal(3) if n == 5 else None)
    assert not shm_wait.wait_round(peer.words, ROUND, SLEEPERS, 3, peer.address, budget,
                                   _no_check)
    assert len(calls) == 5 and peer.words[SLEEPERS] == 0  # never announced a sleep
    assert budget.quiet_s == shm_wait.QUIET_MIN_S  # cheap yields reset the next period


def test_repeated_slow_yields_lengthen_the_quiet_period_up_to_its_bound() -> None:
    budget = shm_wait.YieldBudget()
    lengths = []
    for _ in range(12):
        now = time.monotonic()
        budget.slow(now)
        lengths.append(round(budget.quiet_until - now, 6))
    assert lengths[:3] == [shm_wait.QUIET_MIN_S, 2 * shm_wait.QUIET_MIN_S,
                           4 * shm_wait.QUIET_MIN_S]
    assert max(lengths) == lengths[-1] == shm_wait.QUIET_MAX_S


@NEEDS_FUTEX
def test_a_sleeping_wait_runs_its_checks_and_their_failure_ends_it(
        peer: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    _yields(monkeypatch, lambda n: time.sleep(0.002))
    seen: list[tuple[float, int]] = []

    class PeerDied(Exception):
        pass

    def check(now: float) -> None:
        seen.append((now, peer.words[SLEEPERS]))
        if len(seen) == 5:
            raise PeerDied("rank 1 died")

    start = time.monotonic()
    with pytest.raises(PeerDied, match="rank 1 died"):
        shm_wait.wait_round(peer.words, ROUND, SLEEPERS, 1, peer.address,
                            shm_wait.YieldBudget(), check)
    assert all(sleeping == 1 for _, sleeping in seen[1:])  # checked while asleep
    # checks come every millisecond or so even asleep (5 of them: far under 5 s)
    assert seen[-1][0] - start < 5.0
    gaps = [b - a for (a, _), (b, _) in zip(seen, seen[1:], strict=False)]
    assert min(gaps) >= shm_wait.CHECK_INTERVAL_S * 0.9

"""How a rank waits for a peer's round word once its spin is over: yield, then sleep.

A wait that did not end in its spin (shm_domain.py) yields the CPU (``os.sched_yield``) for a
while and then sleeps on the peer's round word (futex.py) until the peer's signal wakes it.
Yielding is right while the ranks have the CPUs to themselves: a yield with nothing else to
run returns in a microsecond, and the peer's arrival is seen at once. When the CPUs are taken
(ranks outnumber cores, or other jobs run), a yield hands the core away for a scheduler slice
(milliseconds) and the rank comes back to the run queue to yield again, taking CPU time its
late peer needs; there a waiting rank must sleep at once, as gloo's do.

The rule kept here: a wait yields for at most YIELD_PHASE_S, and only while yielding is
cheap. A yield that took longer than SLOW_YIELD_S (someone else had the CPU) ends the
yielding at once, and later waits go straight from their spin to sleep for a quiet period
(QUIET_MIN_S, doubling while each next try finds the CPU taken again, up to QUIET_MAX_S);
the first wait after it yields again, and a yield phase with no slow yield resets the period.
Learned per domain, from its own waits: no clock or load reading outside them.

Sleeps never outlast the caller's check interval: every CHECK_INTERVAL_S the caller's
``check`` runs (liveness, aborts, deadline, stall warning), so a dead peer is named as fast
asleep as awake. A futex wake can be missed (shm_domain.py: no memory fence in Python); the
sleep's timeout bounds what that costs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ringtorch._wire import futex

CHECK_INTERVAL_S = 0.001   # how often a waiting rank checks liveness, aborts and the deadline
YIELD_PHASE_S = 0.002      # the longest a wait yields before it sleeps
SLOW_YIELD_S = 200e-6      # a yield this long: another task had the CPU (an idle one: ~1 µs)
QUIET_MIN_S, QUIET_MAX_S = 0.01, 0.5  # no yielding for this long after a slow yield
NAP_MIN_S, NAP_MAX_S = 20e-6, 500e-6  # sleeps without a futex (other CPUs): doubling naps
FUTEX_NAP_MIN_S = 50e-6    # the shortest futex sleep (a check due sooner runs after it)


class YieldBudget:
    """Whether waits may yield now, learned from the domain's recent waits (module docstring).

    Attributes:
        quiet_until: monotonic time before which waits do not yield (0: they may).
        quiet_s: the next quiet period's length.
        slow_yields: slow yields seen so far (each started a quiet period).
    """

    def __init__(self) -> None:
        self.quiet_until = 0.0
        self.quiet_s = QUIET_MIN_S
        self.slow_yields = 0

    def may_yield(self, now: float) -> bool:
        return now >= self.quiet_until

    def slow(self, now: float) -> None:
        """A yield took long: sleep instead of yielding for the next quiet period, and make
        the period after it longer (reset by :meth:`fast`)."""
        self.slow_yields += 1
        self.quiet_until = now + self.quiet_s
        self.quiet_s = min(2 * self.quiet_s, QUIET_MAX_S)

    def fast(self) -> None:
        """A whole yield phase (or the wait it ended) went by without a slow yield."""
        self.quiet_s = QUIET_MIN_S


def wait_round(word: memoryview, index: int, sleepers: int, t: int, address: Callable[[], int],
               budget: YieldBudget, check: Callable[[float], None]) -> bool:
    """Return once ``word[index]`` (a peer's round word) is at least ``t``; True when the wait
    went to sleep. ``address()`` is the word's address for the futex (looked up only to
    sleep); ``word[sleepers]`` is set before each sleep so that the peer wakes us.
    ``check(now)`` runs every CHECK_INTERVAL_S and raises to end the wait."""
    start = now = time.monotonic()
    next_check = start + CHECK_INTERVAL_S
    if budget.may_yield(now):
        while word[index] < t:
            if now >= next_check:
                check(now)
                next_check = now + CHECK_INTERVAL_S
            if now - start >= YIELD_PHASE_S:
                budget.fast()
                break
            before = time.monotonic()  # after the check: its own time is not the yield's
            os.sched_yield()
            now = time.monotonic()
            if now - before > SLOW_YIELD_S:
                budget.slow(now)
                break
        else:
            budget.fast()
            return False
    if word[index] >= t:
        return False
    nap = NAP_MIN_S
    while word[index] < t:
        if now >= next_check:
            check(now)
            next_check = now + CHECK_INTERVAL_S
        if futex.available:
            seen = word[index]
            word[sleepers] = 1  # the peer wakes its round word's sleepers after its next store
            if seen < t:
                futex.wait(address(), seen, max(next_check - now, FUTEX_NAP_MIN_S))
        else:
            time.sleep(nap)
            nap = min(nap * 2, NAP_MAX_S)
        now = time.monotonic()
    return True


__all__ = ["CHECK_INTERVAL_S", "YIELD_PHASE_S", "YieldBudget", "wait_round"]

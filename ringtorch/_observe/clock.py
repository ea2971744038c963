"""Each rank's clock offset to rank 0, measured through the job's store at start-up.

Rank ``r`` writes a ping key, rank 0 answers with its ``time.monotonic_ns()``, and rank ``r``
notes when the answer arrived; of ``ROUNDS`` such round trips it keeps the shortest. Since
rank 0 read its clock between the ping and the answer, the offset lies within half that round
trip of ``answer - midpoint``: the error bound this module reports is that half, never a guess.
(On one host every process reads the same CLOCK_MONOTONIC, so the true offset is 0 and the
measured one is within its bound of it.) Rank 0 answers the ranks one after the other; the
whole exchange takes about ``ROUNDS * (world_size - 1)`` store round trips, and no rank
returns before every rank is done (so every rank traces before any can reach another).

The store is anything with torch's ``set``/``get`` (blocking until the key exists); this
module imports no store, so every layer that has one can align its clock.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ringtorch._observe.trace import Clock

ROUNDS = 8
_PREFIX = "rt_trace_clock"
# The run id of ranks that could not agree on one (no shared store): rank 0 then merges any
# unaligned rank's file it finds.
UNALIGNED_RUN = "unaligned"


def align(store: Any, rank: int, world_size: int, rounds: int = ROUNDS) -> tuple[Clock, str]:
    """Measure this rank's clock against rank 0's (every rank of the job calls it).

    Returns:
        (the Clock of this rank, the run id rank 0 chose for this trace).
    """
    if rank == 0:
        origin = time.monotonic_ns()
        origin_unix = time.time_ns()
        run_id = uuid.uuid4().hex
        store.set(f"{_PREFIX}/origin", f"{origin} {origin_unix} {run_id}")
        for peer in range(1, world_size):
            for i in range(rounds):
                store.get(f"{_PREFIX}/ping/{peer}/{i}")
                store.set(f"{_PREFIX}/pong/{peer}/{i}", str(time.monotonic_ns()))
        for peer in range(1, world_size):  # every rank is done (and traces: trace_run.py)
            store.get(f"{_PREFIX}/done/{peer}")
        store.set(f"{_PREFIX}/all_done", b"1")
        return Clock(0, 0, origin, origin_unix, rounds), run_id
    best_rtt, best_offset = -1, 0
    for i in range(rounds):
        sent = time.monotonic_ns()
        store.set(f"{_PREFIX}/ping/{rank}/{i}", b"1")
        answer = int(store.get(f"{_PREFIX}/pong/{rank}/{i}"))
        back = time.monotonic_ns()
        rtt = back - sent
        if best_rtt < 0 or rtt < best_rtt:
            best_rtt, best_offset = rtt, answer - (sent + back) // 2
    origin_text = store.get(f"{_PREFIX}/origin")
    if isinstance(origin_text, bytes):
        origin_text = origin_text.decode()
    origin, origin_unix, run_id = origin_text.split()
    store.set(f"{_PREFIX}/done/{rank}", b"1")
    store.get(f"{_PREFIX}/all_done")
    return Clock(best_offset, (best_rtt + 1) // 2, int(origin), int(origin_unix), rounds), run_id


def unaligned() -> Clock:
    """The clock of a rank that shares no store with the others: every rank's time zero is
    its CLOCK_MONOTONIC's zero (the boot), so ranks on one host agree exactly and ranks on
    different hosts do not; ``error_ns`` -1 says the offset was not measured."""
    return Clock(0, -1, 0, time.time_ns() - time.monotonic_ns(), 0)


__all__ = ["ROUNDS", "UNALIGNED_RUN", "align", "unaligned"]

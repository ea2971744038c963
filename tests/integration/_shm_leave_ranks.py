"""Rank-side code of the shared-memory test of a peer that arrives and then leaves while a
rank waiting for it looks at it (test_shm_failures.py).

Rank 0 holds rank 1 back (a store key) until rank 0 is inside its liveness check of rank 1:
rank 0 has read rank 1's round word (late) and is about to ask whether rank 1's process still
holds its segment. Only then does rank 1 arrive at the barrier, pass it (rank 0 arrived long
before) and close its group; rank 0's check goes on once rank 1's segment is released. That
is the interleaving a loaded machine produces by preempting rank 0 at that point.
"""

from __future__ import annotations

import time
from typing import Any

from ringtorch._observe.operation import issued
from ringtorch.testing import wait_for
from tests.integration._shm_ranks import backend, flat_space, store


def _hold_rank_1_until_probed(b: Any, rank: int, world_size: int) -> None:
    """(rank 0) The first liveness probe of rank 1's segment lets rank 1 go, waits until it
    has closed its group, then answers (the real probe: not alive)."""
    segment = flat_space(b).domain.segments[1]
    probe = segment.owner_alive

    def probe_after_rank_1_left() -> bool:
        segment.owner_alive = probe
        store(rank, world_size).set("leave/go", "1")
        wait_for(lambda: not probe(), timeout=20, what="rank 1 to close its group")
        return probe()

    segment.owner_alive = probe_after_rank_1_left


def arrive_then_leave(rank: int, world_size: int) -> dict[str, Any]:
    """Barrier #1 (set-up), then barrier #2 with rank 1 arriving as described above; what
    each rank's barrier #2 raised, and whether rank 0's probe ran."""
    b = backend(rank, world_size, "arrive_then_leave")
    b.barrier(issued("barrier", 1, time.monotonic() + 30))
    if rank == 0:
        _hold_rank_1_until_probed(b, rank, world_size)
    elif rank == 1:
        store(rank, world_size).wait(["leave/go"])
    try:
        b.barrier(issued("barrier", 2, time.monotonic() + 30))
        error = ("no error", "")
    except Exception as exc:
        error = (type(exc).__name__, str(exc))
    out = {"error": error}
    if rank == 0:
        out["probed"] = store(rank, world_size).check(["leave/go"])
    b.close()
    return out

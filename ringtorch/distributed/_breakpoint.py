"""``dist.breakpoint()``: one rank in pdb while the others wait in a barrier.

Kept apart from the debug levels (_debug.py), which the group layer imports: this function
calls the group layer and the collectives, so it sits above both.
"""

from __future__ import annotations

import pdb
import sys
import traceback
from datetime import timedelta
from typing import Any

from ringtorch.distributed import _world, groups, ops

_breakpoint_counts: dict[int, int] = {}


class _DistributedPdb(pdb.Pdb):
    """A pdb that reads this process's /dev/stdin (a worker's stdin is not the terminal)."""

    def interaction(self, *args: Any, **kwargs: Any) -> None:
        saved = sys.stdin
        try:
            with open("/dev/stdin") as sys.stdin:
                pdb.Pdb.interaction(self, *args, **kwargs)
        finally:
            sys.stdin = saved


def breakpoint(rank: int = 0, skip: int = 0, timeout_s: float | None = 3600) -> None:
    """Stop rank ``rank`` in pdb while the other ranks wait in a barrier (torch's
    ``dist.breakpoint``); the first ``skip`` hits of this call site are ignored.

    While it runs, every group's timeout is raised to ``timeout_s`` so that the debugging
    session does not time the job out.
    """
    if skip > 0:
        key = hash("".join(traceback.format_stack()[:-1]))
        count = _breakpoint_counts.get(key, 0) + 1
        _breakpoint_counts[key] = count
        if count <= skip:
            return
    if timeout_s is not None:
        for pg in list(_world._world.pg_map):
            pg.set_timeout(timedelta(seconds=timeout_s))
    if groups.get_rank() == rank:
        debugger = _DistributedPdb()
        debugger.message(f"\n!!! ATTENTION !!!\n\nType 'up' to get to the frame that called "
                         f"dist.breakpoint(rank={rank})\n")
        debugger.set_trace(sys._getframe(1))
    ops.barrier()


__all__ = ["breakpoint"]

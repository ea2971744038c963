"""Rank-side code of test_rpc_shutdown_rrefs.py: a call that is still running on a worker
whose main thread has entered ``rpc.shutdown()`` uses an RRef it received in its arguments
(the shape of torch's RPC + DDP tutorial, whose trainers shut down while the master's call
runs on them)."""

from __future__ import annotations

from typing import Any

import torch

import ringtorch.distributed.rpc as rpc
from ringtorch.testing import wait_for
from tests.integration._rpc_common import start


def reported(rank: int) -> bool:
    """(on worker0, the shutdown leader) whether ``rank`` has sent its first shutdown report,
    which it sends only after it has passed where its user RRefs could be deleted."""
    from ringtorch.distributed.rpc._state import STATE

    leader = STATE.shutdown_leader
    return leader is not None and rank in leader.reports.get(0, {})


def use_once_shutting_down(rref: rpc.RRef[Any]) -> Any:
    """(on worker1) wait until worker1's main thread is in shutdown, then use ``rref``."""
    wait_for(lambda: rpc.rpc_sync("worker0", reported, args=(1,)), 20,
             "worker1 to report to the shutdown leader")
    return rref.to_here() * 2


def scenario(rank: int, ws: int) -> Any:
    start(rank, ws)
    result = None
    if rank == 0:
        rref = rpc.remote("worker2", torch.arange, args=(3.0,))
        result = rpc.rpc_async("worker1", use_once_shutting_down, args=(rref,)).wait()
    rpc.shutdown()
    return result

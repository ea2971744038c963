"""Rank functions for the rendezvous-cost test (run by run_ranks): how many requests each
rank sends to the job's TCPStore to start a job, make a group and start RPC."""

from __future__ import annotations

from datetime import timedelta
from typing import Any


def _tcp_store(store: Any) -> Any:
    while hasattr(store, "underlying_store"):  # the group's PrefixStores around the TCPStore
        store = store.underlying_store
    return store


def group_requests(rank: int, world_size: int) -> dict[str, dict[str, int]]:
    """The store requests this rank sent, by operation: to init_process_group and its first
    barrier, then to new_group over every rank and its first barrier."""
    import ringtorch.distributed as dist
    from ringtorch.distributed import distributed_c10d

    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    store = _tcp_store(distributed_c10d._get_default_store())
    dist.barrier()
    init = store.statistics().requests_by_op
    group = dist.new_group(list(range(world_size)))
    dist.barrier(group)
    after = store.statistics().requests_by_op
    dist.barrier()  # every rank has read its counters before rank 0's store may go
    dist.destroy_process_group()
    return {"init": init, "new_group": {op: n - init.get(op, 0) for op, n in after.items()
                                        if n - init.get(op, 0)}}

"""Rank-side code of tests/integration/test_timeline.py (RINGTORCH_TRACE is set by the driver)."""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from torch import nn

import ringtorch.distributed as dist
import ringtorch.distributed.rpc as rpc
from ringtorch.distributed import trace
from ringtorch.distributed.distributed_c10d import _get_default_store
from ringtorch.nn.parallel import DistributedDataParallel as DDP


def operations(rank: int, ws: int) -> dict[str, Any]:
    """Collectives (one asynchronous), a point-to-point pair and a span of the user's own."""
    dist.init_process_group("gloo")
    begun = trace.now()
    dist.all_reduce(torch.ones(256))
    work = dist.all_reduce(torch.ones(1024), async_op=True)
    dist.broadcast(torch.zeros(3, dtype=torch.int64), src=0)
    work.wait()
    if rank == 0:
        dist.send(torch.ones(5), dst=1)
    elif rank == 1:
        dist.recv(torch.zeros(5), src=0)
    dist.barrier()
    trace.span("user", "my step", begun, trace.now(), step=1)
    merged = trace.finish() if rank == 0 else None
    dist.destroy_process_group()
    return {"merged": merged, "pid": os.getpid()}


def square(x: torch.Tensor) -> torch.Tensor:
    return x * x


def rpc_call(rank: int, ws: int) -> str | None:
    """RPC only (no process group): worker0 calls worker1; each rank then writes its file."""
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=ws)
    if rank == 0:
        rpc.rpc_sync("worker1", square, args=(torch.ones(16),))
    rpc.shutdown()
    return trace.finish()


class _Stack(nn.Module):
    """Four layers of 64 KiB of weights: with 0.1 MB buckets, one bucket per layer or two."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Linear(128, 128) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def ddp_step(rank: int, ws: int) -> int:
    """Two DDP training steps with small buckets; returns how many buckets there were."""
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(_Stack(), bucket_cap_mb=0.1)
    for _ in range(2):
        model(torch.randn(8, 128)).sum().backward()
    buckets = len(model.reducer.buckets)
    dist.destroy_process_group()
    return buckets


PEER_AWAY = "peer not joined yet"


def profiled(rank: int, ws: int, folder: str) -> dict[str, Any]:
    """Collectives, p2p and RPC inside torch.profiler; what its summary and trace show.

    Each rank exports to its own file: two ranks exporting to one path race each other,
    and one of them can find the file missing or half written when it reads it back.
    """
    dist.init_process_group("gloo")
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=ws)
    dist.all_reduce(torch.ones(8))  # outside the profiler: no range
    with torch.profiler.profile(record_shapes=True) as prof:
        dist.all_reduce(torch.ones(256))
        # rank 1 joins the all_gather only after rank 0 has closed the range "peer not joined
        # yet", opened after its issue: rank 0's gather completes after that range ends
        store = _get_default_store()
        if rank == 1:
            store.wait(["peer may join"])
        work = dist.all_gather_into_tensor(torch.zeros(4 * ws), torch.ones(4), async_op=True)
        if rank == 0:
            with torch.profiler.record_function(PEER_AWAY):
                pass
            store.set("peer may join", b"1")
        work.wait()
        if rank == 0:
            dist.send(torch.ones(5), dst=1)
        elif rank == 1:
            dist.recv(torch.zeros(5), src=0)
        with dist.record_comm("layer1::grad all_reduce"):
            dist.all_reduce(torch.ones(64))
        if rank == 0:
            rpc.rpc_sync("worker1", square, args=(torch.ones(16),))
            rpc.rpc_async("worker1", square, args=(torch.ones(2, 3),)).wait()
        dist.barrier()
    rpc.shutdown()
    dist.destroy_process_group()
    path = os.path.join(folder, f"trace{rank}.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"]
                  if e.get("ph") == "X" and ("gloo:" in e["name"] or "rpc_" in e["name"]
                                             or "layer1" in e["name"] or e["name"] == PEER_AWAY
                                             or e["name"] == "ringtorch:comm_params")]
    counts = {(avg.key, str(avg.input_shapes)): avg.count
              for avg in prof.key_averages(group_by_input_shape=True)}
    return {"events": events, "counts": counts}

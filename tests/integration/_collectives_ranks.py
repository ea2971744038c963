"""Rank-side code of tests/integration/test_collectives_ops.py: what the facade does above
any backend, which the conformance suite (ringtorch.testing.check_backend) does not cover.

Inputs are ``grid(rank, salt)``, a pure function, so the driver rebuilds every rank's inputs
and computes the expected results with NumPy itself. The functions here only call
ringtorch.distributed and return what they got.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import torch

import ringtorch.distributed as dist


def values(rank: int, n: int, salt: int) -> np.ndarray:
    """Small integers (sums exact in float32), different per rank and salt."""
    return (np.arange(n) * (salt % 7 + 1) + 3 * rank - salt % 5).astype(np.float64)


def grid(rank: int, salt: int) -> torch.Tensor:
    """A non-contiguous 4x3 float32 view (the transpose of a 3x4 tensor)."""
    return torch.from_numpy(values(rank, 12, salt).astype(np.float32)).view(3, 4).t()


def run_extras(rank: int, ws: int) -> dict[str, Any]:
    """NumPy arrays, non-contiguous tensors, coalesced reductions, the async barrier's Work,
    sequence numbers and the monitored barrier; returns {case: result}."""
    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    # NumPy arrays in place of tensors; results land in the arrays.
    a = values(rank, 6, 1)
    dist.all_reduce(a)
    out["numpy/all_reduce"] = a
    a = values(rank, 6, 3).astype(np.int32)
    dist.broadcast(a, src=0)
    out["numpy/broadcast"] = a
    parts = [np.zeros(6, dtype=np.float32) for _ in range(ws)]
    dist.all_gather(parts, values(rank, 6, 4).astype(np.float32))
    out["numpy/all_gather"] = parts
    # Non-contiguous tensors work where torch's gloo takes them.
    t = grid(rank, 50)
    dist.all_reduce(t)
    out["noncontig/all_reduce"] = t.contiguous()
    t = grid(rank, 51)
    dist.broadcast(t, src=0)
    out["noncontig/broadcast"] = t.contiguous()
    parts = [torch.zeros(3, 4).t() for _ in range(ws)]
    dist.all_gather(parts, grid(rank, 52))
    out["noncontig/all_gather"] = [p.contiguous() for p in parts]
    t = grid(rank, 54)
    dist.reduce(t, dst=0)
    if rank == 0:
        out["noncontig/reduce"] = t.contiguous()
    gl = [torch.zeros(3, 4).t() for _ in range(ws)] if rank == 0 else None
    dist.gather(grid(rank, 55), gl, dst=0)
    if rank == 0:
        out["noncontig/gather"] = [g.contiguous() for g in gl]
    o = torch.zeros(3, 4).t()
    dist.scatter(o, [grid(j, 56) for j in range(ws)] if rank == 0 else None, src=0)
    out["noncontig/scatter"] = o.contiguous()
    # The coalesced form reduces every tensor of the list.
    ts = [torch.from_numpy(values(rank, 3, 60).astype(np.float32)),
          torch.from_numpy(values(rank, 5, 61).astype(np.float32))]
    dist.all_reduce_coalesced(ts)
    out["all_reduce_coalesced"] = ts
    # What an async barrier's Work says once waited for.
    w = dist.barrier(async_op=True)
    w.wait()
    out["async/barrier"] = (w.is_completed(), w.is_success(), w.exception(), w.result())
    dist.monitored_barrier(timeout=timedelta(seconds=20))
    out["seq"] = dist.group.WORLD._get_sequence_number_for_group()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    out["uses_shm"] = bool(getattr(backend, "uses_shm", False))
    dist.destroy_process_group()
    return out

"""One distributed program, written against whichever ``dist`` module it is given.

tests/compat/test_same_script.py runs it under torch.distributed (gloo) and under
ringtorch.distributed, and compares what the ranks got.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import torch


def script(rank: int, ws: int, module: str) -> dict[str, Any]:
    dist = importlib.import_module(module)
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo")
    out: dict[str, Any] = {"rank": dist.get_rank(), "size": dist.get_world_size(),
                           "backend": str(dist.get_backend()),
                           "initialized": dist.is_initialized()}
    base = torch.arange(6) - 2 + rank
    for op in ("SUM", "PRODUCT", "MIN", "MAX"):
        for dtype in (torch.int64, torch.float64, torch.float32, torch.uint8):
            t = (base.abs() if dtype == torch.uint8 else base).to(dtype)
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
            out[f"all_reduce/{op}/{dtype}"] = t
    for op in ("BAND", "BOR", "BXOR"):
        t = base.abs() + 3
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out[f"all_reduce/{op}"] = t
    t = torch.tensor([True, False, rank == 1])
    dist.all_reduce(t)
    out["all_reduce/bool"] = t
    t = torch.tensor([1 + 2j, rank - 1j], dtype=torch.complex64)
    dist.all_reduce(t)
    out["all_reduce/complex"] = t
    t = torch.full((3,), float(rank))
    dist.broadcast(t, src=ws - 1)
    out["broadcast"] = t
    parts = [torch.zeros(2, dtype=torch.int32) for _ in range(ws)]
    dist.all_gather(parts, torch.tensor([rank, rank * 2], dtype=torch.int32))
    out["all_gather"] = parts
    o = torch.zeros(2 * ws)
    dist.all_gather_into_tensor(o, torch.tensor([float(rank), 7.0]))
    out["all_gather_into_tensor"] = o
    o = torch.zeros(2)
    dist.reduce_scatter_tensor(o, torch.arange(2.0 * ws) * (rank + 1))
    out["reduce_scatter_tensor"] = o
    o = torch.zeros(1)
    dist.reduce_scatter(o, [torch.full((1,), float(rank * 10 + j)) for j in range(ws)])
    out["reduce_scatter"] = o
    gl = [torch.zeros(2) for _ in range(ws)] if rank == 0 else None
    dist.gather(torch.full((2,), float(rank)), gl, dst=0)
    out["gather"] = gl
    o = torch.zeros(2)
    dist.scatter(o, [torch.full((2,), float(j + 5)) for j in range(ws)] if rank == 0 else None,
                 src=0)
    out["scatter"] = o
    t = torch.full((2,), float(rank + 1))
    dist.reduce(t, dst=ws - 1, op=dist.ReduceOp.PRODUCT)
    if rank == ws - 1:
        out["reduce"] = t
    sends = [j + 1 for j in range(ws)]
    recvs = [rank + 1] * ws
    o = torch.zeros(sum(recvs))
    dist.all_to_all_single(o, torch.arange(float(sum(sends))) + 100 * rank, recvs, sends)
    out["all_to_all_single"] = o
    outs = [torch.zeros(1) for _ in range(ws)]
    dist.all_to_all(outs, [torch.full((1,), float(rank * 10 + j)) for j in range(ws)])
    out["all_to_all"] = outs
    got = torch.zeros(2)
    if rank % 2 == 0:
        dist.send(torch.full((2,), float(rank)), dst=(rank + 1) % ws)
        out["recv_src"] = dist.recv(got, src=(rank - 1) % ws)
    else:
        out["recv_src"] = dist.recv(got, src=(rank - 1) % ws)
        dist.send(torch.full((2,), float(rank)), dst=(rank + 1) % ws)
    out["recv"] = got
    work = dist.all_reduce(torch.ones(2), async_op=True)
    work.wait()
    out["work"] = (work.is_completed(), work.is_success(), work.result())
    objs = [None] * ws
    dist.all_gather_object(objs, {"rank": rank, "t": torch.tensor([rank])})
    out["all_gather_object"] = objs
    box = [None, None] if rank else [{"a": 1}, "b"]
    dist.broadcast_object_list(box, src=0)
    out["broadcast_object_list"] = box
    g = dist.new_group([0, ws - 1])
    t = torch.full((1,), float(rank + 1))
    out["subgroup_result"] = dist.all_reduce(t, group=g)
    out["subgroup"] = (t, dist.get_rank(g), dist.get_world_size(g))
    dist.barrier()
    dist.destroy_process_group()
    return out

"""Rank functions of the backend door's tests (test_backend_door*.py): plain torch programs.

Nothing here imports ringtorch: each rank says ``init_process_group("ringtorch")`` as a user
would, and the differential job runs every operation twice, on the "ringtorch" group and on
a gloo group made in the same processes, and returns both results for the test to compare.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


def _inputs(rank: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    base = torch.arange(n) % 7 + rank + 1
    if dtype == torch.bool:
        return (base % 2).bool()
    return base.to(dtype)


def _both(fn: Any, door: Any, gloo: Any) -> tuple[Any, Any]:
    return fn(door), fn(gloo)


def _ops(rank: int, ws: int) -> list[tuple[str, Any]]:
    """(name, fn(group) -> result) for every operation, for the same inputs on any group."""
    ops: list[tuple[str, Any]] = []

    def all_reduce(dtype: torch.dtype, op: Any) -> Any:
        def run(g: Any) -> Any:
            t = _inputs(rank, 5, dtype)
            dist.all_reduce(t, op=op, group=g)
            return t
        return run

    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16,
                  torch.float16, torch.uint8):
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN,
                   dist.ReduceOp.PRODUCT):
            ops.append((f"all_reduce {dtype} {op}", all_reduce(dtype, op)))
    for op in (dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR):
        ops.append((f"all_reduce int64 {op}", all_reduce(torch.int64, op)))
    ops.append(("all_reduce bool MAX", all_reduce(torch.bool, dist.ReduceOp.MAX)))

    def coalesced(g: Any) -> Any:
        ts = [_inputs(rank, 3, torch.float32), _inputs(rank, 4, torch.float32) * 2]
        dist.all_reduce_coalesced(ts, group=g)
        return ts

    def broadcast(g: Any) -> Any:
        t = _inputs(rank, 6, torch.int64)
        dist.broadcast(t, src=ws - 1, group=g)
        return t

    def reduce(g: Any) -> Any:
        t = _inputs(rank, 6, torch.float32)
        dist.reduce(t, dst=ws - 1, op=dist.ReduceOp.MAX, group=g)
        return t if rank == ws - 1 else None

    def all_gather(g: Any) -> Any:
        out = [torch.zeros(3, dtype=torch.float64) for _ in range(ws)]
        dist.all_gather(out, _inputs(rank, 3, torch.float64), group=g)
        return out

    def all_gather_into_tensor(g: Any) -> Any:
        out = torch.zeros(ws * 2, 3, dtype=torch.int32)
        dist.all_gather_into_tensor(out, _inputs(rank, 6, torch.int32).view(2, 3), group=g)
        return out

    def all_gather_coalesced(g: Any) -> Any:
        outs = [[torch.zeros(2), torch.zeros(3)] for _ in range(ws)]  # per rank, per input
        dist.all_gather_coalesced(outs, [_inputs(rank, 2, torch.float32),
                                         _inputs(rank, 3, torch.float32)], group=g)
        return outs

    def reduce_scatter(g: Any) -> Any:
        out = torch.zeros(2)
        dist.reduce_scatter(out, [_inputs(rank, 2, torch.float32) * (i + 1)
                                  for i in range(ws)], group=g)
        return out

    def reduce_scatter_tensor(g: Any) -> Any:
        out = torch.zeros(3, dtype=torch.float64)
        dist.reduce_scatter_tensor(out, _inputs(rank, 3 * ws, torch.float64), group=g)
        return out

    def all_to_all(g: Any) -> Any:
        outs = [torch.zeros(2, dtype=torch.int64) for _ in range(ws)]
        dist.all_to_all(outs, [_inputs(rank, 2, torch.int64) + 10 * j for j in range(ws)],
                        group=g)
        return outs

    def all_to_all_single_uneven(g: Any) -> Any:
        # rank r sends j + 1 rows to rank j and receives r + 1 rows from each rank
        in_splits = [j + 1 for j in range(ws)]
        out_splits = [rank + 1] * ws
        inp = _inputs(rank, sum(in_splits) * 2, torch.float32).view(-1, 2)
        out = torch.zeros(sum(out_splits), 2)
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=g)
        return out

    def gather(g: Any) -> Any:
        outs = [torch.zeros(4) for _ in range(ws)] if rank == 0 else None
        dist.gather(_inputs(rank, 4, torch.float32), outs, dst=0, group=g)
        return outs

    def scatter(g: Any) -> Any:
        out = torch.zeros(3, dtype=torch.int64)
        ins = [_inputs(0, 3, torch.int64) * (j + 1) for j in range(ws)] if rank == 0 else None
        dist.scatter(out, ins, src=0, group=g)
        return out

    def p2p_ring(g: Any) -> Any:
        got = torch.zeros(3)
        if ws == 1:
            return got
        send = dist.isend(_inputs(rank, 3, torch.float32), (rank + 1) % ws, group=g)
        dist.recv(got, (rank - 1) % ws, group=g)
        send.wait()
        return got

    def batch_p2p(g: Any) -> Any:
        got = torch.zeros(2)
        if ws == 1:
            return got
        reqs = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, _inputs(rank, 2, torch.float32), (rank + 1) % ws, g),
            dist.P2POp(dist.irecv, got, (rank - 1) % ws, g)])
        for r in reqs:
            r.wait()
        return got

    def objects(g: Any) -> Any:
        out: list[Any] = [None] * ws
        dist.all_gather_object(out, {"rank": rank, "sq": rank * rank}, group=g)
        return out

    def coalescing_manager(g: Any) -> Any:
        ts = [_inputs(rank, 2, torch.float32), _inputs(rank, 3, torch.float32)]
        with dist._coalescing_manager(group=g, async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t, group=g)
        cm.wait()
        return ts

    ops += [("all_reduce_coalesced", coalesced), ("broadcast", broadcast), ("reduce", reduce),
            ("all_gather", all_gather), ("all_gather_into_tensor", all_gather_into_tensor),
            ("all_gather_coalesced", all_gather_coalesced), ("reduce_scatter", reduce_scatter),
            ("reduce_scatter_tensor", reduce_scatter_tensor), ("all_to_all", all_to_all),
            ("all_to_all_single uneven", all_to_all_single_uneven), ("gather", gather),
            ("scatter", scatter), ("p2p ring", p2p_ring), ("batch_isend_irecv", batch_p2p),
            ("all_gather_object", objects), ("_coalescing_manager", coalescing_manager)]
    return ops


def differential(rank: int, ws: int) -> dict[str, Any]:
    """Every operation on backend "ringtorch" and on gloo; AVG and PREMUL_SUM (which gloo
    lacks) against gloo's SUM, for the test to scale."""
    import warnings

    warnings.simplefilter("ignore")  # torch's deprecation warnings of the old names
    dist.init_process_group("ringtorch")
    gloo = dist.new_group(backend="gloo")
    door = dist.group.WORLD
    out: dict[str, Any] = {"backend": dist.get_backend(), "gloo": dist.get_backend(gloo)}
    for name, fn in _ops(rank, ws):
        out[name] = _both(fn, door, gloo)
    for dtype in (torch.float32, torch.bfloat16):
        t = _inputs(rank, 5, dtype)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        s = _inputs(rank, 5, dtype)
        dist.all_reduce(s, group=gloo)
        out[f"all_reduce {dtype} AVG"] = (t, s)
    for factor in (2.5, torch.tensor([0.5])):
        t = _inputs(rank, 4, torch.float32)
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(factor))
        s = _inputs(rank, 4, torch.float32)
        dist.all_reduce(s, group=gloo)
        out[f"all_reduce PREMUL_SUM {float(factor)}"] = (t, s * float(factor))
    dist.barrier()
    # torch's dist.monitored_barrier admits gloo only; the group's own method is ringtorch's
    door.monitored_barrier(timedelta(seconds=30))
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=30))
    except ValueError as exc:
        out["dist.monitored_barrier"] = str(exc)
    dist.destroy_process_group()
    return out


__all__ = ["differential"]

"""Rank-side code of tests/integration/test_object_collectives.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import ringtorch.distributed as dist


def payload(rank: int) -> dict[str, Any]:
    """A different object per rank, with tensors (several dtypes) and arrays inside."""
    grad = torch.arange(3.0) + rank
    grad.requires_grad_(True)
    return {
        "rank": rank, "name": f"worker-{rank}", "nested": [rank, (rank, "x" * rank), {rank}],
        "f32": torch.arange(4, dtype=torch.float32) * rank,
        "bf16": torch.full((2, 3), rank + 0.5, dtype=torch.bfloat16),
        "cplx": torch.tensor([rank + 1j]),
        "strided": torch.arange(12.0).view(3, 4).t() + rank,
        "grad": grad,
        "array": np.arange(5, dtype=np.int16) * rank,
        "array_strided": (np.arange(12, dtype=np.float64).reshape(3, 4) + rank).T,
        "big": torch.full((1 << 18,), float(rank)),
    }


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


def objects(rank: int, ws: int) -> dict[str, Any]:
    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    gathered: list[Any] = [None] * (ws + 1)
    dist.all_gather_object(gathered, payload(rank))
    out["all_gather_object"] = gathered
    dst_list = [None] * ws if rank == ws - 1 else None
    dist.gather_object(payload(rank), dst_list, dst=ws - 1)
    out["gather_object"] = dst_list
    mine = [payload(rank), "tail", rank]
    keep = list(mine)
    dist.broadcast_object_list(mine, src=ws - 1)
    out["broadcast_object_list"] = mine
    out["broadcast_src_untouched"] = rank == ws - 1 and all(a is b for a, b in zip(mine, keep, strict=True))
    box: list[Any] = [None, "second entry stays"]
    dist.scatter_object_list(box, [payload(r) for r in range(ws)] if rank == 0 else None, src=0)
    out["scatter_object_list"] = box
    if ws > 1:
        if rank == 0:
            dist.send_object_list([payload(0), {"to": 1}], dst=1)
        elif rank == 1:
            got: list[Any] = [None, None]
            out["recv_from"] = dist.recv_object_list(got)
            out["recv_object_list"] = got
    if ws > 2:
        tail = dist.new_group([ws - 2, ws - 1])
        objs = [None, None]
        dist.all_gather_object(objs, rank, group=tail)
        out["subgroup"] = objs
    out["errors"] = {
        "short_list": _call(dist.all_gather_object, [None] * (ws - 1), rank) if ws > 1 else None,
        "gather_list_on_non_dst": _call(dist.gather_object, rank, [None] * ws, dst=ws - 1)
        if rank != ws - 1 else None,
        "scatter_empty_output": _call(dist.scatter_object_list, [], [1] * ws, src=0),
        "scatter_no_input": _call(dist.scatter_object_list, [None], None, src=rank),
    }
    dist.barrier()
    dist.destroy_process_group()
    return out

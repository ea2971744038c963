"""One program of differentiable collectives, written against whichever library it is given.

tests/compat/test_functional_collectives.py runs it under torch (gloo,
torch.distributed.nn.functional) and under ringtorch, and compares every forward result and
every input gradient. Values are small integers in float64, so every summation order gives
the same bits.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any

import torch

Case = Callable[[list[torch.Tensor]], Any]


def _weights(out: torch.Tensor, rank: int, slot: int) -> torch.Tensor:
    """Different per rank, per output and per element, so each gradient tells them apart."""
    return (torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape)
            + 1 + 10 * rank + 100 * slot)


def _run(rank: int, fn: Case, inputs: list[torch.Tensor], keep_forward: bool = True
         ) -> tuple[list[torch.Tensor] | None, list[torch.Tensor | None]]:
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    out = fn(leaves)
    outs = list(out) if isinstance(out, tuple) else [out]
    loss = sum((o * _weights(o, rank, i)).sum() for i, o in enumerate(outs))
    loss.backward()
    forward = [o.detach().clone() for o in outs] if keep_forward else None
    return forward, [x.grad for x in leaves]


def _group_cases(dist: Any, F: Any, rank: int, g: Any, n: int, root: int) -> dict[str, Any]:
    """Every collective on group ``g`` of ``n`` ranks (numbered as the world's), rooted at
    ``root``: case name -> (forward outputs, input gradients)."""
    dtype = torch.float64
    x = torch.arange(4, dtype=dtype) + 10 * rank
    mine = [torch.arange(2, dtype=dtype) + 10 * rank + 3 * j for j in range(n)]
    sends = [j + 1 for j in range(n)]  # rank r sends j + 1 rows to rank j
    recvs = [rank + 1] * n             # and receives r + 1 rows from each
    rows = torch.arange(float(sum(sends)) * 2, dtype=dtype).reshape(-1, 2) + 100 * rank
    even = torch.arange(2.0 * n, dtype=dtype) + 7 * rank
    product = dist.ReduceOp.PRODUCT
    return {
        "broadcast": _run(rank, lambda t: F.broadcast(t[0], root, group=g), [x]),
        "reduce": _run(rank, lambda t: F.reduce(t[0], root, group=g), [x],
                       keep_forward=rank == root),
        "reduce_product": _run(rank, lambda t: F.reduce(t[0], root, op=product, group=g), [x],
                               keep_forward=rank == root),
        "gather": _run(rank, lambda t: F.gather(t[0], root, group=g), [x]),
        "scatter": _run(rank, lambda t: F.scatter(t, root, group=g), mine),
        "all_reduce": _run(rank, lambda t: F.all_reduce(t[0], group=g), [x]),
        "all_reduce_max": _run(rank, lambda t: F.all_reduce(t[0], dist.ReduceOp.MAX, group=g),
                               [x]),
        "all_gather": _run(rank, lambda t: F.all_gather(t[0], group=g), [x]),
        "reduce_scatter": _run(
            rank, lambda t: F.reduce_scatter(torch.zeros(2, dtype=dtype), t, group=g), mine),
        "all_to_all": _run(
            rank, lambda t: F.all_to_all([torch.zeros(2, dtype=dtype) for _ in range(n)], t,
                                         group=g), mine),
        "all_to_all_single": _run(
            rank, lambda t: F.all_to_all_single(torch.zeros(sum(recvs), 2, dtype=dtype), t[0],
                                                recvs, sends, group=g), [rows]),
        "all_to_all_single_even": _run(
            rank, lambda t: F.all_to_all_single(torch.zeros(2 * n, dtype=dtype), t[0], group=g),
            [even]),
    }


def script(rank: int, ws: int, library: str) -> dict[str, Any]:
    dist = importlib.import_module(f"{library}.distributed")
    F = importlib.import_module(f"{library}.distributed.nn.functional")
    warnings.simplefilter("ignore")  # torch's FutureWarnings about _functional_collectives
    dist.init_process_group("gloo")
    last = ws - 1
    # A group that is not the default one; in a world of 3, rank 2 is not in it. Its ranks
    # are numbered as the world's, where torch's functional rooted collectives are right.
    pair = dist.new_group([0, 1])
    out: dict[str, Any] = {}
    groups = {"world": (None, ws, last)}
    if rank < 2:
        groups["pair"] = (pair, 2, 1)
    for gname, (g, n, root) in groups.items():
        for case, result in _group_cases(dist, F, rank, g, n, root).items():
            out[f"{case}/{gname}"] = result
    dist.barrier()
    dist.destroy_process_group()
    return out

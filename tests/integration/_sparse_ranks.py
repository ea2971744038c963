"""Rank-side code of tests/integration/test_sparse_all_reduce.py: all_reduce of sparse COO
tensors and the errors around it, under ringtorch or torch's gloo (the same code for both).

Inputs are pure functions of the rank (:func:`inputs`), so the driver can rebuild them.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from tests.integration._failures_ranks import error_of


def _coo(indices: Any, values: Any, size: tuple[int, ...], **kwargs: Any) -> torch.Tensor:
    return torch.sparse_coo_tensor(indices, values, size, check_invariants=True, **kwargs)


def inputs(rank: int, case: str) -> torch.Tensor:
    """Rank ``rank``'s sparse tensor for ``case`` (a different nnz on every rank)."""
    if case == "matrix":  # 5 x 4, rank + 2 entries, some shared between ranks
        rows = [(3 * rank + j) % 5 for j in range(rank + 2)]
        cols = [(rank + 2 * j) % 4 for j in range(rank + 2)]
        return _coo([rows, cols], [float(rank + j + 1) for j in
                                                      range(rank + 2)], (5, 4))
    if case == "duplicates":  # an uncoalesced input: index 1 twice
        return _coo([[1, 1, rank % 3]], [1.0, 2.0, 3.0 + rank], (3,))
    if case == "hybrid":  # one sparse dimension, one dense
        return _coo([[rank % 3]], torch.full((1, 2), rank + 1.0), (3, 2))
    if case == "int64":
        return _coo([[rank, 3]], [5 + rank, 7], (4,), dtype=torch.int64)
    if case == "empty_on_rank_0":
        if rank == 0:
            return _coo(torch.zeros(1, 0, dtype=torch.int64), [], (4,))
        return _coo([[rank]], [float(rank)], (4,))
    raise ValueError(case)


CASES = ["matrix", "duplicates", "hybrid", "int64", "empty_on_rank_0"]


def _state(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.is_sparse, t.is_coalesced(), tuple(t.shape), t.dtype, t._indices().tolist(),
            t._values().tolist())



def sparse(rank: int, ws: int, library: str) -> dict[str, Any]:
    """Every case's all_reduce (synchronous, and one asynchronous), then the errors."""
    dist: Any = importlib.import_module(library)
    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    for case in CASES:
        t = inputs(rank, case)
        out[case] = (dist.all_reduce(t), _state(t))
    t = inputs(rank, "matrix")
    work = dist.all_reduce(t, async_op=True)
    out["async"] = (work.wait(), _state(t))
    for op in ("MAX", "MIN", "PRODUCT", "AVG"):
        out[f"op {op}"] = error_of(dist.all_reduce, inputs(rank, "matrix"),
                                 op=getattr(dist.ReduceOp, op))
    out["shapes differ"] = error_of(dist.all_reduce, _coo([[0]], [1.0], (3 + rank,)))
    out["sparse dims differ"] = error_of(dist.all_reduce, inputs(rank, "matrix" if rank == 0
                                                               else "hybrid"))
    s = inputs(rank, "hybrid")
    out["broadcast"] = error_of(dist.broadcast, s, 0)
    out["all_gather"] = error_of(dist.all_gather, [torch.zeros(3, 2) for _ in range(ws)], s)
    t = inputs(rank, "matrix")  # the group still works
    dist.all_reduce(t)
    out["after"] = _state(t)
    dist.destroy_process_group()
    return out

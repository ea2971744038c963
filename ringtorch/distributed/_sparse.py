"""``all_reduce`` of a sparse COO tensor, as torch's gloo does it: built on all-gathers.

Every rank gathers every rank's coalesced indices and values (padded to the largest nnz, since
an all-gather moves equal parts) and sums the sparse tensors locally, in rank order, so every
rank gets the same bits. The rule kept from gloo: only SUM is defined, the ranks' tensors must
have the same shape, and the result, written into the caller's tensor, is coalesced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ringtorch.collectives.reduce_op import ReduceOp

# gather(output, input): all-gather ``input`` of every rank into ``output`` (rank order)
Gather = Callable[[torch.Tensor, torch.Tensor], Any]

UNSUPPORTED_OP = ("ProcessGroupGloo::allreduce: unsupported reduction operation (allreduce of "
                  "sparse tensors only works with ReduceOp.SUM)")
SHAPES_DIFFER = "Sparse dimensions do not match"


def check_op(op: Any) -> None:
    """Raises RuntimeError (torch's text) unless ``op`` is SUM."""
    if op != ReduceOp.SUM:
        raise RuntimeError(UNSUPPORTED_OP)


def all_reduce(tensor: torch.Tensor, world_size: int, gather: Gather) -> None:
    """Sum the sparse ``tensor`` of every rank into it, coalesced.

    Raises:
        RuntimeError: the ranks' tensors differ in shape or number of sparse dimensions
            (on every rank: each sees every rank's header).
    """
    local = tensor.detach().coalesce()
    nnz = local._nnz()
    # header: [ndim, sparse_dim, nnz]; then the sizes, once every rank has as many
    header = torch.tensor([local.dim(), local.sparse_dim(), nnz], dtype=torch.int64)
    headers = torch.empty(world_size * 3, dtype=torch.int64)
    gather(headers, header)
    headers = headers.view(world_size, 3)
    if (headers[:, :2] != header[:2]).any():
        raise RuntimeError(SHAPES_DIFFER)
    size = torch.tensor(local.shape, dtype=torch.int64)
    sizes = torch.empty(world_size * local.dim(), dtype=torch.int64)
    gather(sizes, size)
    if (sizes.view(world_size, -1) != size).any():
        raise RuntimeError(SHAPES_DIFFER)
    counts = headers[:, 2].tolist()
    most = max(counts)
    # indices (sparse_dim x nnz) and values (nnz x dense dims), padded to the largest nnz
    indices = torch.zeros(local.sparse_dim(), most, dtype=torch.int64)
    indices[:, :nnz] = local._indices()
    values = torch.zeros((most, *local._values().shape[1:]), dtype=local.dtype)
    values[:nnz] = local._values()
    all_indices = torch.empty((world_size, *indices.shape), dtype=torch.int64)
    gather(all_indices.view(-1), indices.view(-1))
    all_values = torch.empty((world_size, *values.shape), dtype=values.dtype)
    gather(all_values.view(-1) if all_values.numel() else all_values, values.reshape(-1))
    # sum in rank order: the same bits on every rank
    total = None
    for rank, count in enumerate(counts):
        # valid by construction (coalesced parts of one shape): no invariant check
        part = torch.sparse_coo_tensor(all_indices[rank][:, :count], all_values[rank][:count],
                                       local.shape, dtype=local.dtype, check_invariants=False)
        total = part if total is None else total + part
    assert total is not None
    with torch.no_grad():
        tensor.copy_(total.coalesce())


__all__ = ["SHAPES_DIFFER", "UNSUPPORTED_OP", "all_reduce", "check_op"]

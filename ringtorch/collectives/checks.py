"""Argument checks of ProcessGroup operations, run before anything is sent.

Each check raises the error torch's gloo process group raises for the same mistake (same
exception type, same text after the ``ProcessGroup::<op>:`` prefix), so that messages users
paste into a search engine still find answers. Where gloo crashes the process or hangs
(a wrong ``reduce_scatter`` output size, a ``gather`` list of the wrong length, a send to a
rank that does not exist) these checks raise instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ringtorch import _buffers


def fail(op: str, message: str, exc: type[Exception] = RuntimeError) -> Exception:
    """The error for ``op``, to be raised by the caller."""
    return exc(f"ProcessGroup::{op}: {message}")


def shape(tensor: torch.Tensor) -> str:
    """A shape as gloo prints it: ``(2, 3)``."""
    return "(" + ", ".join(str(d) for d in tensor.shape) + ")"


def tensor(op: str, obj: Any) -> torch.Tensor:
    """One operand as a CPU, dense tensor (NumPy arrays are wrapped, sharing memory).

    Raises:
        TypeError: not a tensor or array.
        NotImplementedError: a sparse tensor (torch's dispatcher error; a RuntimeError).
        RuntimeError: a non-CPU tensor.
    """
    if type(obj) is torch.Tensor and obj.is_cpu and obj.layout is torch.strided:
        return obj  # the common case, checked in a few hundred nanoseconds
    if not _buffers.is_buffer(obj):
        raise TypeError(f"ProcessGroup::{op}: expected a torch.Tensor or numpy.ndarray, "
                        f"got {type(obj)}")
    t = _buffers.as_tensor(obj)
    if t.layout != torch.strided:
        raise _not_dense(op, t)
    if t.device.type != "cpu":
        raise fail(op, f"ringtorch's native backend runs on CPU tensors; got a tensor on "
                       f"{t.device} (move it with .cpu(), or wait for the nccl backend)")
    return t


# ProcessGroup method -> the c10d operator torch's dispatcher names when it has no kernel
_C10D_OPS = {"all_gather_single": "_allgather_base_", "reduce_scatter_single":
             "_reduce_scatter_base_", "recv_anysource": "recv_any_source_", "send": "send",
             "recv": "recv_"}


def _not_dense(op: str, t: torch.Tensor) -> Exception:
    """torch's error for a sparse operand where the operation takes dense tensors only (its
    dispatcher's NotImplementedError, a RuntimeError), with our sentence after it."""
    key = "SparseCPU" if t.layout is torch.sparse_coo else "SparseCsrCPU"
    if t.layout not in (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr,
                        torch.sparse_bsc):
        return fail(op, f"only supports dense tensors, got layout {t.layout}")
    return NotImplementedError(
        f"Could not run 'c10d::{_C10D_OPS.get(op, op + '_')}' with arguments from the '{key}' "
        f"backend. ProcessGroup::{op} only supports dense tensors (all_reduce with SUM is the "
        f"one collective that takes sparse COO tensors)")


def tensors(op: str, objs: Any, what: str = "tensor list") -> list[torch.Tensor]:
    """A non-empty list of operands, each checked by :func:`tensor`."""
    if not isinstance(objs, (list, tuple)):
        raise TypeError(f"ProcessGroup::{op}: expected a list of tensors, got {type(objs)}")
    if not objs:
        raise fail(op, f"requires non-empty {what}")
    return [tensor(op, o) for o in objs]


def single(op: str, objs: Any, what: str = "tensor list") -> torch.Tensor:
    """The one operand of a single-element list."""
    if type(objs) is list and len(objs) == 1:
        return tensor(op, objs[0])
    ts = tensors(op, objs, what)
    if len(ts) != 1:
        raise fail(op, f"requires a single-element {what}")
    return ts[0]


def type_and_sizes_match(op: str, ts: Sequence[torch.Tensor], like: torch.Tensor) -> None:
    """Every tensor of ``ts`` has the dtype and shape of ``like`` (gloo's wording)."""
    for index, t in enumerate(ts):
        if t.dtype != like.dtype:
            raise fail(op, f"invalid tensor type at index {index} (expected {like.dtype}, "
                           f"got {t.dtype})")
        if t.shape != like.shape:
            raise fail(op, f"invalid tensor size at index {index} (expected {shape(like)}, "
                           f"got {shape(t)})")


def same_dtype(op: str, ts: Sequence[torch.Tensor], dtype: torch.dtype) -> None:
    """Every tensor of ``ts`` has ``dtype``."""
    for index, t in enumerate(ts):
        if t.dtype != dtype:
            raise fail(op, f"invalid tensor type at index {index} (expected {dtype}, "
                           f"got {t.dtype})")


def numel_matches(op: str, ts: Sequence[torch.Tensor], like: torch.Tensor) -> None:
    """Every tensor of ``ts`` holds as many elements as ``like`` (shapes may differ)."""
    for index, t in enumerate(ts):
        if t.numel() != like.numel():
            raise fail(op, f"invalid tensor size at index {index} (expected {shape(like)}, "
                           f"got {shape(t)})")


def root(op: str, rank: Any, size: int, what: str = "root") -> int:
    """A root/peer group rank within ``0 .. size-1``."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise fail(op, f"invalid {what} rank: {rank}")
    return rank


def peer(op: str, rank: Any, size: int, what: str) -> int:
    """A point-to-point peer's group rank (torch would crash on one out of range)."""
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise TypeError(f"ProcessGroup::{op}: the {what} rank must be an int, got {rank!r}")
    if not 0 <= rank < size:
        raise ValueError(f"Invalid {what} rank: {rank} is not a rank of this group (valid "
                         f"group ranks are 0 to {size - 1})")
    return rank


def tag(op: str, value: Any) -> int:
    """A point-to-point tag: a non-negative int (negative tags are ringtorch's own)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"ProcessGroup::{op}: tag must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"ProcessGroup::{op}: tag must be >= 0, got {value} (negative tags "
                         f"are reserved for ringtorch's own messages)")
    return value


def contiguous_p2p(t: torch.Tensor) -> None:
    """Point-to-point operations need contiguous tensors, as in torch."""
    if not t.is_contiguous():
        raise RuntimeError("input tensor has to be contiguous")


def row_splits(op: str, t: torch.Tensor, splits: Sequence[int], size: int,
               what: str) -> list[int]:
    """Dim-0 split sizes of ``t`` as element counts (even splits when ``splits`` is empty)."""
    if t.dim() == 0:
        raise fail(op, f"the {what} tensor must have at least one dimension")
    rows = t.shape[0]
    row_numel = t.numel() // rows if rows else 0
    if not splits:
        if rows % size != 0:
            raise ValueError("Tensor's dim 0 does not divide equally across group size")
        return [rows // size * row_numel] * size
    splits = list(splits)
    if len(splits) != size:
        raise RuntimeError("Number of tensor splits not equal to group size")
    if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in splits):
        raise fail(op, f"{what} split sizes must be non-negative ints, got {splits}")
    if sum(splits) != rows:
        raise RuntimeError("Split sizes doesn't match total dim 0 size")
    return [s * row_numel for s in splits]


def self_split(op: str, rank: int, out_counts: Sequence[int], in_counts: Sequence[int]) -> None:
    """What a rank sends itself must fit what it expects from itself (an all-to-all's slot
    ``rank`` of its input and output splits)."""
    if out_counts[rank] != in_counts[rank]:
        raise ValueError(f"{op}: this rank sends itself {in_counts[rank]} elements but expects "
                         f"{out_counts[rank]}")


__all__ = [
    "self_split",
    "contiguous_p2p",
    "fail",
    "numel_matches",
    "peer",
    "root",
    "row_splits",
    "same_dtype",
    "shape",
    "single",
    "tag",
    "tensor",
    "tensors",
    "type_and_sizes_match",
]

"""A reduction lowered once, before it reaches a transport: pre-scale, base op, post step.

torch's reductions include two that are not element-wise operators: PREMUL_SUM (multiply every
rank's input by a factor, then SUM) and AVG (SUM, then divide by the group size). The rule this
module keeps: transports and algorithms only ever apply a *base* op (SUM, PRODUCT, MIN, MAX,
BAND, BOR, BXOR) through a byte reducer; the scaling before and the division after are
described here, once, for every backend:

* ``scale(tensor, factor_of(op, lowering))`` — PREMUL_SUM's multiplication, in place (or
  into a copy for an input the caller still owns);
* ``post`` — AVG's division, applied in place to reduced bytes. A transport applies it to
  every reduced element exactly once; it may do so slice by slice as slices are produced
  (the shared-memory staged all_reduce divides each slice while it is still in cache),
  or on the whole result at the end.

A Lowering is cached per (reduction, dtype) by its user (the division depends only on the
group size), so a collective pays one dictionary lookup for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from ringtorch._buffers import typed_view
from ringtorch.collectives.reduce_op import (
    ByteReducer,
    RedOpType,
    byte_reducer,
    check_reduce_op,
    premul_factor,
)

PostStep = Callable[[np.ndarray], None]

# AVG and PREMUL_SUM reduce as SUM; every other op is its own base.
_BASE = {RedOpType.AVG: RedOpType.SUM, RedOpType.PREMUL_SUM: RedOpType.SUM}

# dtypes whose AVG division NumPy applies: the same IEEE division as torch's div_ (bit for
# bit), without torch's intra-op threads, which a collective's waits would have to share the
# cores with; the others (bfloat16, complex) divide with torch on a view of the bytes
_NUMPY_DIVIDES = {torch.float32: np.float32, torch.float64: np.float64,
                  torch.float16: np.float16}


class Lowering(NamedTuple):
    """One (reduction, dtype) pair as the transports run it.

    Attributes:
        kind: the user's reduction (what the ranks must agree on; AVG stays AVG here).
        base: the op the transport applies.
        reducer: the byte reducer of ``base`` on the dtype.
        itemsize: bytes per element.
        scales: whether inputs are first multiplied by the op's factor (PREMUL_SUM).
        post: the in-place step after the reduction (AVG's division), or None.
    """

    kind: RedOpType
    base: RedOpType
    reducer: ByteReducer
    itemsize: int
    scales: bool
    post: PostStep | None


def lower(kind: RedOpType, dtype: torch.dtype, opname: str, world_size: int) -> Lowering:
    """Lower ``kind`` on ``dtype`` for a group of ``world_size`` ranks.

    Raises:
        ValueError, RuntimeError: the pair has no meaning (reduce_op.check_reduce_op).
    """
    check_reduce_op(kind, dtype, opname)
    base = _BASE.get(kind, kind)
    post = _divider(dtype, world_size) if kind is RedOpType.AVG else None
    itemsize = torch.empty((), dtype=dtype).element_size()
    return Lowering(kind, base, byte_reducer(base, dtype), itemsize,
                    kind is RedOpType.PREMUL_SUM, post)


def factor_of(op: object, lowering: Lowering) -> float | torch.Tensor | None:
    """The factor PREMUL_SUM scales by (None for every other op), taken before anything runs.

    Raises:
        ValueError: a PREMUL_SUM without a factor.
    """
    return premul_factor(op) if lowering.scales else None


def scale(tensor: torch.Tensor, factor: float | torch.Tensor, in_place: bool) -> torch.Tensor:
    """PREMUL_SUM's pre-scaling of ``tensor`` by ``factor``: in place, or a scaled copy (an
    input the caller keeps must not change)."""
    if in_place:
        return tensor.mul_(factor)
    return (tensor * factor).to(tensor.dtype)


def _divider(dtype: torch.dtype, size: int) -> PostStep:
    np_dtype = _NUMPY_DIVIDES.get(dtype)
    if np_dtype is not None:
        def divide_numpy(reduced: np.ndarray) -> None:
            values = reduced.view(np_dtype)
            np.divide(values, size, out=values)

        return divide_numpy

    def divide_torch(reduced: np.ndarray) -> None:
        if not reduced.nbytes:
            return
        values = typed_view(reduced, dtype)
        if dtype is torch.complex32:  # no division kernel: through complex64
            values.copy_(values.to(torch.complex64).div_(size))
        else:
            values.div_(size)

    return divide_torch


# Overflow wraps (ints) or goes to inf (floats) silently, as in torch: NumPy's warnings are
# switched off around a collective through its error-state context variable (what
# np.errstate does, minus the cost of building a context manager on every call).
try:
    from numpy._core._ufunc_config import (  # type: ignore[attr-defined]
        _extobj_contextvar as _FP_STATE,
    )

    with np.errstate(all="ignore"):
        _FP_IGNORE = _FP_STATE.get()

    def ignore_fp_errors() -> Any:
        """Switch NumPy's floating-point warnings off; returns the token to restore with."""
        return _FP_STATE.set(_FP_IGNORE)

    def restore_fp_errors(token: Any) -> None:
        _FP_STATE.reset(token)
except (ImportError, AttributeError):  # another NumPy layout: the public, slower way
    def ignore_fp_errors() -> Any:
        state = np.errstate(all="ignore")
        state.__enter__()
        return state

    def restore_fp_errors(token: Any) -> None:
        token.__exit__(None, None, None)


__all__ = ["Lowering", "PostStep", "factor_of", "ignore_fp_errors", "lower", "restore_fp_errors",
           "scale"]

"""Reduction operators (torch's ``ReduceOp``) and the in-place element-wise reductions behind them.

``ReduceOp`` behaves like ``torch.distributed.ReduceOp``: ``ReduceOp.SUM`` is a member of the
enum ``ReduceOp.RedOpType`` and also passes ``isinstance(x, ReduceOp)``; ``ReduceOp(ReduceOp.SUM)``
is an instance equal (and hash-equal) to the member; ``make_premul_sum(factor)`` builds the
PREMUL_SUM instance torch builds with ``_make_nccl_premul_sum``.

The rule this module keeps: a reduction never allocates per call and never reorders operands
behind the caller's back. ``reduce_into(dst, src, op)`` computes ``dst = dst (op) src`` in
place, or ``dst = src (op) dst`` with ``src_first=True``, so that an algorithm can put the
lower rank's operand first everywhere and get bitwise-identical results on every rank. Dtypes
NumPy computes well (ints, uint16-64, bool, float32/64, complex64/128) go through NumPy ufuncs
with ``out=`` (the fastest per call); float16, bfloat16 and complex32 go through torch's own
kernels (NumPy's float16 is software-emulated, ~70x slower here).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ringtorch._buffers import as_bytes, typed_view


class RedOpType(enum.IntEnum):
    """The reduction kinds, numbered as torch numbers them (``ReduceOp.RedOpType``)."""

    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8
    UNUSED = 9

    def __str__(self) -> str:
        return f"RedOpType.{self.name}"

    __format__ = object.__format__  # type: ignore[assignment]


_Kind = RedOpType  # the enum, for annotations inside ReduceOp (whose RedOpType is an attribute)


class _ReduceOpMeta(type):
    """Lets ``isinstance(ReduceOp.SUM, ReduceOp)`` hold, as it does in torch."""

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, RedOpType) or type.__instancecheck__(cls, instance)


class ReduceOp(metaclass=_ReduceOpMeta):
    """An element-wise reduction for collectives: ``ReduceOp.SUM``, ``ReduceOp.MAX``, ...

    The class attributes are ``RedOpType`` members (usable wherever torch accepts
    ``dist.ReduceOp.SUM``); instances wrap a member plus, for PREMUL_SUM, the scale factor.
    Instances compare and hash equal to their member.
    """

    RedOpType = RedOpType
    SUM = RedOpType.SUM
    AVG = RedOpType.AVG
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX
    BAND = RedOpType.BAND
    BOR = RedOpType.BOR
    BXOR = RedOpType.BXOR
    PREMUL_SUM = RedOpType.PREMUL_SUM
    UNUSED = RedOpType.UNUSED

    def __init__(self, op: _Kind | ReduceOp) -> None:
        if isinstance(op, ReduceOp) and not isinstance(op, RedOpType):
            self.op: _Kind = op.op
            self.factor: float | torch.Tensor | None = op.factor
            return
        if not isinstance(op, RedOpType):
            raise TypeError(f"ReduceOp() takes a ReduceOp.RedOpType member such as "
                            f"ReduceOp.SUM, got {op!r}")
        self.op = op
        self.factor = None

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RedOpType):
            return self.op == other
        if type(other) is ReduceOp:
            return self.op == other.op and _same_factor(self.factor, other.factor)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.op)

    def __repr__(self) -> str:
        if self.factor is not None:
            return f"ReduceOp({self.op}, factor={self.factor})"
        return f"ReduceOp({self.op})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (int(self.op), self.factor))


def _same_factor(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    return bool(a == b)


def _rebuild(op: int, factor: Any) -> ReduceOp:
    inst = ReduceOp(RedOpType(op))
    inst.factor = factor
    return inst


def make_premul_sum(factor: float | torch.Tensor) -> ReduceOp:
    """The PREMUL_SUM op: every rank's input is multiplied by ``factor`` before the sum
    (torch's ``_make_nccl_premul_sum``). ``factor`` is a Python number or a 1-element tensor."""
    inst = ReduceOp(RedOpType.PREMUL_SUM)
    inst.factor = factor
    return inst


def op_type(op: Any) -> RedOpType:
    """The RedOpType of a ReduceOp member or instance (or of torch's own ReduceOp objects,
    converted by name so that code mixing ``torch.distributed.ReduceOp`` keeps working).

    Raises:
        TypeError: ``op`` is not a reduction op.
    """
    if isinstance(op, RedOpType):
        return op
    if isinstance(op, ReduceOp):
        return op.op
    name = getattr(op, "name", None) or getattr(getattr(op, "op", None), "name", None)
    if isinstance(name, str) and name in RedOpType.__members__:
        return RedOpType[name]
    raise TypeError(f"expected a ReduceOp such as ReduceOp.SUM, got {op!r}")


def premul_factor(op: Any) -> float | torch.Tensor | None:
    """The PREMUL_SUM factor of ``op`` (None for every other op)."""
    if op_type(op) is not RedOpType.PREMUL_SUM:
        return None
    factor = getattr(op, "factor", None)
    if factor is None:
        raise ValueError("ReduceOp.PREMUL_SUM needs a factor: build it with "
                         "make_premul_sum(factor) (torch: dist._make_nccl_premul_sum)")
    return factor


_INTEGRAL = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool,
             torch.uint16, torch.uint32, torch.uint64}
_COMPLEX_DENIED = {RedOpType.MAX, RedOpType.MIN, RedOpType.PRODUCT, RedOpType.BAND,
                   RedOpType.BOR, RedOpType.BXOR}
_BITWISE = {RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR}
_ADDITIVE = {RedOpType.SUM, RedOpType.AVG, RedOpType.PREMUL_SUM}


def check_reduce_op(op: Any, dtype: torch.dtype, opname: str = "all_reduce") -> RedOpType:
    """Reject a (reduction, dtype) pair that has no meaning, before anything is sent.

    Returns:
        The RedOpType of ``op``.

    Raises:
        ValueError: a complex dtype with MAX/MIN/PRODUCT/BAND/BOR/BXOR (torch's message).
        RuntimeError: BAND/BOR/BXOR on a non-integral dtype, AVG on an integral dtype, UNUSED,
            or a dtype that has no reduction kernel (float8); the message says which.
    """
    kind = op_type(op)
    if kind is RedOpType.UNUSED:
        raise RuntimeError(f"{opname}: ReduceOp.UNUSED is not a reduction")
    if dtype.is_complex and kind in _COMPLEX_DENIED:
        raise ValueError(f"{opname} does not support {kind} on complex tensors")
    if kind in _BITWISE and dtype not in _INTEGRAL:
        raise RuntimeError(f"Cannot use ReduceOp.{kind.name} with non-integral dtype {dtype}")
    if kind is RedOpType.AVG and dtype in _INTEGRAL:
        raise RuntimeError(
            f"{opname}: ReduceOp.AVG needs a floating or complex dtype, got {dtype}: the "
            f"average of integers is not an integer (torch's gloo fails the same way); "
            f"use SUM and divide, or convert the tensor to a floating dtype"
        )
    if kind is RedOpType.PREMUL_SUM and dtype in _INTEGRAL:
        raise RuntimeError(f"{opname}: ReduceOp.PREMUL_SUM needs a floating or complex dtype, "
                           f"got {dtype}")
    if _torch_kernel(kind, dtype) is None and _numpy_kernel(kind, dtype) is None:
        raise RuntimeError(f"{opname}: no {kind} reduction exists for dtype {dtype}")
    return kind


# NumPy dtype for each torch dtype NumPy reduces natively and fast.
_NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8), torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16), torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64), torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32), torch.uint64: np.dtype(np.uint64),
    torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64), torch.complex128: np.dtype(np.complex128),
}
_TORCH_ONLY = {torch.float16, torch.bfloat16, torch.complex32}

# SUM, AVG and PREMUL_SUM all add: AVG divides and PREMUL_SUM scales outside the reduction.
_NUMPY_UFUNCS: dict[RedOpType, Any] = {
    RedOpType.SUM: np.add, RedOpType.AVG: np.add, RedOpType.PREMUL_SUM: np.add,
    RedOpType.PRODUCT: np.multiply, RedOpType.MIN: np.minimum, RedOpType.MAX: np.maximum,
    RedOpType.BAND: np.bitwise_and, RedOpType.BOR: np.bitwise_or,
    RedOpType.BXOR: np.bitwise_xor,
}
_TORCH_FNS: dict[RedOpType, Any] = {
    RedOpType.SUM: torch.add, RedOpType.AVG: torch.add, RedOpType.PREMUL_SUM: torch.add,
    RedOpType.PRODUCT: torch.mul, RedOpType.MIN: torch.minimum, RedOpType.MAX: torch.maximum,
}


def _numpy_kernel(kind: RedOpType, dtype: torch.dtype) -> Any:
    if dtype not in _NUMPY_DTYPES:
        return None
    return _NUMPY_UFUNCS.get(kind)


def _torch_kernel(kind: RedOpType, dtype: torch.dtype) -> Any:
    if dtype not in _TORCH_ONLY:
        return None
    if dtype is torch.complex32 and kind not in _ADDITIVE:
        return None
    return _TORCH_FNS.get(kind)


ByteReducer = Callable[[np.ndarray, np.ndarray, bool], None]
ByteCombiner = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def byte_reducer(op: Any, dtype: torch.dtype) -> ByteReducer:
    """A function ``f(dst, src, src_first)`` reducing raw bytes in place.

    ``dst`` and ``src`` are uint8 NumPy arrays of the same length, holding whole elements of
    ``dtype``; afterwards ``dst`` holds ``dst (op) src`` (or ``src (op) dst`` when
    ``src_first``). Algorithms work on bytes so they never touch torch; this is the one place
    that knows how to add them. AVG and PREMUL_SUM reduce as SUM (the caller divides/scales).
    The function's ``into`` attribute is its three-operand form (:func:`combiner_of`).

    Raises:
        RuntimeError, ValueError: as :func:`check_reduce_op`.
    """
    kind = check_reduce_op(op, dtype)
    ufunc = _numpy_kernel(kind, dtype)
    if ufunc is not None:
        np_dtype = _NUMPY_DTYPES[dtype]

        def reduce_numpy(dst: np.ndarray, src: np.ndarray, src_first: bool) -> None:
            d = dst.view(np_dtype)
            if src_first:
                ufunc(src.view(np_dtype), d, out=d)
            else:
                ufunc(d, src.view(np_dtype), out=d)

        def into_numpy(dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
            ufunc(a.view(np_dtype), b.view(np_dtype), out=dst.view(np_dtype))

        reduce_numpy.into = into_numpy  # type: ignore[attr-defined]
        return reduce_numpy
    fn = _torch_kernel(kind, dtype)

    def reduce_torch(dst: np.ndarray, src: np.ndarray, src_first: bool) -> None:
        d = typed_view(dst, dtype)
        s = typed_view(src, dtype)
        if src_first:
            fn(s, d, out=d)
        else:
            fn(d, s, out=d)

    def into_torch(dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        fn(typed_view(a, dtype), typed_view(b, dtype), out=typed_view(dst, dtype))

    reduce_torch.into = into_torch  # type: ignore[attr-defined]
    return reduce_torch


def combiner_of(reduce: ByteReducer) -> ByteCombiner | None:
    """The three-operand form ``g(dst, a, b)`` of a byte reducer: ``dst = a (op) b`` in one
    pass over memory (no copy of ``a`` into ``dst`` first), or None for a reducer without
    one. ``dst`` may be ``a`` or ``b`` itself, not a partial overlap of either."""
    return getattr(reduce, "into", None)


def reduce_into(dst: torch.Tensor, src: torch.Tensor, op: Any, *, src_first: bool = False) -> None:
    """``dst = dst (op) src`` element-wise, in place (``src (op) dst`` with ``src_first``).

    ``dst`` and ``src`` are contiguous CPU tensors with the same dtype and numel. AVG and
    PREMUL_SUM reduce as SUM here: averaging and pre-scaling belong to the whole collective.

    Raises:
        ValueError: shapes or dtypes differ, or the op is denied for complex tensors.
        RuntimeError: the (op, dtype) pair has no reduction (see :func:`check_reduce_op`).
    """
    if dst.dtype != src.dtype or dst.numel() != src.numel():
        raise ValueError(f"reduce_into needs equal dtypes and sizes, got {dst.dtype}[{dst.numel()}]"
                         f" and {src.dtype}[{src.numel()}]")
    reducer = byte_reducer(op, dst.dtype)
    if dst.numel():
        reducer(as_bytes(dst), as_bytes(src), src_first)


__all__ = [
    "ByteCombiner",
    "ByteReducer",
    "RedOpType",
    "ReduceOp",
    "byte_reducer",
    "combiner_of",
    "check_reduce_op",
    "make_premul_sum",
    "op_type",
    "premul_factor",
    "reduce_into",
]

"""The NumPy oracle of the backend conformance suite: inputs, expected results, refusals.

Written once, for every backend configuration: every rank's input is a pure function of
(case, rank, dtype, numel), so any process rebuilds every rank's input and computes what a
collective must produce with NumPy alone. Nothing here calls ringtorch. Values are small
integers (|x| <= 2, or 0..3 unsigned), so sums, products and PREMUL_SUM are exact in every
dtype, float16 and bfloat16 included; only AVG (a division) is compared with a tolerance.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
SIGNED = (torch.int8, torch.int16, torch.int32, torch.int64)
UNSIGNED = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)
COMPLEX = (torch.complex64, torch.complex128)
DTYPES = (*FLOATS, *SIGNED, *UNSIGNED, torch.bool, *COMPLEX)
# Dtypes torch has but no reduction is defined for: every reduction must be refused.
NO_REDUCTION = (torch.float8_e4m3fn, torch.float8_e5m2)
REDUCTIONS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "PREMUL_SUM", "BAND", "BOR", "BXOR")
PREMUL_FACTOR = 2.5  # exact in every floating dtype, and not a factor a backend could guess
_BITWISE = {"BAND", "BOR", "BXOR"}
_ORDERED = {"PRODUCT", "MIN", "MAX"}
_AVG_TOLERANCE = {torch.float16: 1e-3, torch.bfloat16: 1e-2, torch.float32: 1e-6,
                  torch.float64: 1e-12, torch.complex64: 1e-6, torch.complex128: 1e-12}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``, for case names and messages."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Refusal:
    """How a collective must refuse a (reduction, dtype) pair torch gives no meaning to."""

    exc_type: type[Exception]
    names: tuple[str, ...]  # the message names at least one of these


def refusal(reduction: str, dtype: torch.dtype) -> Refusal | None:
    """The error a reduction on ``dtype`` must raise, or None when it must compute.

    torch's rules: complex numbers have no order and no bits (ValueError); bitwise ops need
    integers or bool; AVG and PREMUL_SUM need floating or complex numbers; float8 has no
    reduction kernel at all.
    """
    name = dtype_name(dtype)
    if dtype.is_complex and (reduction in _ORDERED or reduction in _BITWISE):
        return Refusal(ValueError, ("complex", reduction))
    if dtype in NO_REDUCTION:
        return Refusal(RuntimeError, (name, reduction))
    if reduction in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
        return Refusal(RuntimeError, (reduction,))
    if reduction in ("AVG", "PREMUL_SUM") and not (dtype.is_floating_point or dtype.is_complex):
        return Refusal(RuntimeError, (reduction,))
    return None


def make_input(case: str, rank: int, dtype: torch.dtype, numel: int) -> np.ndarray:
    """Rank ``rank``'s input of ``case`` as a NumPy array (float32 stands for bfloat16 and
    float8, which NumPy lacks); the same on every process that asks."""
    rng = np.random.default_rng([zlib.crc32(case.encode()), rank])
    if dtype is torch.bool:
        return rng.integers(0, 2, numel).astype(np.bool_)
    if dtype in UNSIGNED:
        return rng.integers(0, 4, numel).astype(_numpy_dtype(dtype))
    values = rng.integers(-2, 3, numel)
    if dtype.is_complex:
        return (values + 1j * rng.integers(-2, 3, numel)).astype(_numpy_dtype(dtype))
    return values.astype(_numpy_dtype(dtype))


def to_tensor(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A fresh tensor of ``dtype`` holding ``array``'s values."""
    return torch.from_numpy(np.array(array, copy=True)).to(dtype)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's values as NumPy (bfloat16 and float8 widened to float32, exactly)."""
    t = tensor.detach().contiguous()
    if t.dtype is torch.bfloat16 or t.dtype in NO_REDUCTION:
        t = t.float()
    return t.numpy().copy()


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    if dtype is torch.bfloat16 or dtype in NO_REDUCTION:
        return np.dtype(np.float32)
    return torch.empty(0, dtype=dtype).numpy().dtype


def reduce(inputs: list[np.ndarray], reduction: str, dtype: torch.dtype) -> np.ndarray:
    """What reducing every rank's input with ``reduction`` gives, as NumPy in a wide dtype.

    bool reduces logically: SUM and MAX are OR, PRODUCT and MIN are AND (torch's gloo).
    """
    stack = np.stack(inputs)
    if dtype is torch.bool:
        logical = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or,
                   "PRODUCT": np.logical_and, "MIN": np.logical_and, "BAND": np.logical_and,
                   "BXOR": np.logical_xor}
        return logical[reduction].reduce(stack, axis=0)
    wide = (np.complex128 if dtype.is_complex else np.float64 if dtype.is_floating_point
            else np.uint64 if dtype is torch.uint64 else np.int64)
    stack = stack.astype(wide)
    if reduction == "SUM":
        return stack.sum(axis=0)
    if reduction == "AVG":
        return stack.sum(axis=0) / len(inputs)
    if reduction == "PREMUL_SUM":
        return (stack * PREMUL_FACTOR).sum(axis=0)
    ufunc = {"PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
             "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[reduction]
    return ufunc.reduce(stack, axis=0)


def mismatch(got: torch.Tensor, expected: np.ndarray, dtype: torch.dtype,
             reduction: str = "SUM") -> str | None:
    """Why ``got`` is not ``expected`` (None when it is): dtype, shape, then values, exact
    except for AVG, whose division rounds in the tensor's dtype."""
    if got.dtype != dtype:
        return f"dtype {got.dtype}, expected {dtype}"
    want = to_tensor(np.asarray(expected), dtype).reshape(got.shape) if got.numel() == np.size(
        expected) else None
    if want is None:
        return f"{got.numel()} elements, expected {np.size(expected)}"
    if reduction == "AVG":
        tol = _AVG_TOLERANCE[dtype]
        ok = torch.allclose(got.to(torch.complex128 if dtype.is_complex else torch.float64),
                            want.to(torch.complex128 if dtype.is_complex else torch.float64),
                            rtol=tol, atol=tol)
    else:
        ok = torch.equal(got, want)
    if ok:
        return None
    return f"got {to_numpy(got).ravel().tolist()}, expected {to_numpy(want).ravel().tolist()}"

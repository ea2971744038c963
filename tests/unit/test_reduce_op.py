"""ReduceOp behaves like torch's, and reduce_into reduces every dtype in place like torch does."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.distributed as tdist

from ringtorch._buffers import as_bytes
from ringtorch.collectives.reduce_op import (
    RedOpType,
    ReduceOp,
    byte_reducer,
    check_reduce_op,
    combiner_of,
    make_premul_sum,
    op_type,
    premul_factor,
    reduce_into,
)

R = ReduceOp
NUMERIC = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
           torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64]
TORCH_OPS = {"SUM": torch.add, "PRODUCT": torch.mul, "MIN": torch.minimum, "MAX": torch.maximum}


def test_members_are_enum_values_and_pass_isinstance_like_torch():
    assert list(RedOpType.__members__)[:9] == list(tdist.ReduceOp.RedOpType.__members__)
    assert [int(m) for m in RedOpType][:9] == [int(m) for m in
                                               tdist.ReduceOp.RedOpType.__members__.values()]
    assert isinstance(R.SUM, R)
    assert isinstance(R.SUM, R.RedOpType)
    assert str(R.MAX) == "RedOpType.MAX" == str(tdist.ReduceOp.MAX)
    assert R.UNUSED == 9


def test_instances_equal_and_hash_like_their_member():
    assert R(R.SUM) == R.SUM and R.SUM == R(R.SUM)
    assert R(R.SUM) != R.MAX
    assert {R.MAX: 1}[R(R.MAX)] == 1
    assert R(R(R.MIN)).op is RedOpType.MIN
    with pytest.raises(TypeError, match=r"^ReduceOp\(\) takes a ReduceOp.RedOpType member"):
        R("SUM")  # type: ignore[arg-type]


def test_instances_pickle_with_their_factor():
    assert pickle.loads(pickle.dumps(R(R.BXOR))) == R.BXOR
    premul = pickle.loads(pickle.dumps(make_premul_sum(2.5)))
    assert premul.op is RedOpType.PREMUL_SUM and premul.factor == 2.5


def test_op_type_accepts_torch_ops_and_rejects_others():
    assert op_type(tdist.ReduceOp.MAX) is RedOpType.MAX
    assert op_type(tdist.ReduceOp(tdist.ReduceOp.BAND)) is RedOpType.BAND
    assert op_type(make_premul_sum(3.0)) is RedOpType.PREMUL_SUM
    with pytest.raises(TypeError, match=r"^expected a ReduceOp such as ReduceOp.SUM, got 'max'$"):
        op_type("max")


def test_premul_factor_needs_a_factor():
    assert premul_factor(R.SUM) is None
    assert premul_factor(make_premul_sum(0.5)) == 0.5
    with pytest.raises(ValueError, match=r"^ReduceOp.PREMUL_SUM needs a factor"):
        premul_factor(R.PREMUL_SUM)


def _data(dtype: torch.dtype, seed: int) -> torch.Tensor:
    k = torch.arange(9) * (seed + 2) % 7 - 3
    if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        k = k.abs()
    return k.to(dtype)


@pytest.mark.parametrize("dtype", NUMERIC)
@pytest.mark.parametrize("op", ["SUM", "PRODUCT", "MIN", "MAX"])
def test_reduce_into_matches_torch_for_every_numeric_dtype(dtype, op):
    a, b = _data(dtype, 1), _data(dtype, 2)
    want = TORCH_OPS[op](a.to(torch.float64), b.to(torch.float64)).to(dtype)
    dst = a.clone()
    reduce_into(dst, b, getattr(R, op))
    assert torch.equal(dst, want)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64,
                                   torch.uint64])
@pytest.mark.parametrize(("op", "fn"), [("BAND", torch.bitwise_and), ("BOR", torch.bitwise_or),
                                        ("BXOR", torch.bitwise_xor)])
def test_bitwise_ops_on_integers(dtype, op, fn):
    a, b = _data(dtype, 3), _data(dtype, 4)
    dst = a.clone()
    reduce_into(dst, b, getattr(R, op))
    assert torch.equal(dst, fn(a, b))


@pytest.mark.parametrize(("op", "want"), [
    ("SUM", [True, True, True, False]), ("MAX", [True, True, True, False]),
    ("BOR", [True, True, True, False]), ("PRODUCT", [True, False, False, False]),
    ("MIN", [True, False, False, False]), ("BAND", [True, False, False, False]),
    ("BXOR", [False, True, True, False]),
])
def test_bool_reductions_are_logical(op, want):
    dst = torch.tensor([True, True, False, False])
    reduce_into(dst, torch.tensor([True, False, True, False]), getattr(R, op))
    assert dst.tolist() == want


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128, torch.complex32])
def test_complex_sum(dtype):
    a = torch.tensor([1 + 2j, -3j]).to(dtype)
    dst = a.clone()
    reduce_into(dst, torch.tensor([0.5 - 1j, 2 + 0j]).to(dtype), R.SUM)
    assert torch.equal(dst.to(torch.complex128), torch.tensor([1.5 + 1j, 2 - 3j],
                                                              dtype=torch.complex128))


def test_src_first_swaps_the_operands():
    # min(0.0, -0.0) is order-dependent (both are equal): the order shows in the sign bit
    plain, swapped = torch.tensor([0.0]), torch.tensor([0.0])
    reduce_into(plain, torch.tensor([-0.0]), R.MIN)
    reduce_into(swapped, torch.tensor([-0.0]), R.MIN, src_first=True)
    assert torch.signbit(plain).item() != torch.signbit(swapped).item()


def test_integer_sum_wraps_like_torch():
    dst = torch.tensor([200, 100], dtype=torch.uint8)
    reduce_into(dst, torch.tensor([100, 100], dtype=torch.uint8), R.SUM)
    assert dst.tolist() == [44, 200]


@pytest.mark.parametrize(("op", "dtype", "error", "message"), [
    (R.MAX, torch.complex64, ValueError,
     r"^all_reduce does not support RedOpType.MAX on complex tensors$"),
    (R.BXOR, torch.complex64, ValueError,
     r"^all_reduce does not support RedOpType.BXOR on complex tensors$"),
    (R.BAND, torch.float32, RuntimeError,
     r"^Cannot use ReduceOp.BAND with non-integral dtype torch.float32$"),
    (R.AVG, torch.int64, RuntimeError,
     r"^all_reduce: ReduceOp.AVG needs a floating or complex dtype, got torch.int64"),
    (R.AVG, torch.bool, RuntimeError, r"^all_reduce: ReduceOp.AVG needs a floating"),
    (make_premul_sum(2.0), torch.int32, RuntimeError,
     r"^all_reduce: ReduceOp.PREMUL_SUM needs a floating or complex dtype, got torch.int32$"),
    (R.SUM, torch.float8_e4m3fn, RuntimeError,
     r"^all_reduce: no RedOpType.SUM reduction exists for dtype torch.float8_e4m3fn$"),
    (R.UNUSED, torch.float32, RuntimeError, r"^all_reduce: ReduceOp.UNUSED is not a reduction$"),
])
def test_meaningless_op_dtype_pairs_are_rejected(op, dtype, error, message):
    with pytest.raises(error, match=message):
        check_reduce_op(op, dtype)


def test_reduce_into_rejects_different_shapes():
    with pytest.raises(ValueError, match=r"^reduce_into needs equal dtypes and sizes, got "
                                         r"torch.float32\[3\] and torch.float32\[2\]$"):
        reduce_into(torch.zeros(3), torch.zeros(2), R.SUM)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("op", ["SUM", "MIN"])
def test_the_three_operand_form_writes_a_op_b_into_a_third_buffer_or_into_an_operand(dtype, op):
    a, b = _data(dtype, 5), _data(dtype, 6)
    want = a.clone()
    reduce_into(want, b, getattr(R, op))
    combine = combiner_of(byte_reducer(getattr(R, op), dtype))
    assert combine is not None
    dst = torch.zeros_like(a)
    combine(as_bytes(dst), as_bytes(a), as_bytes(b))
    assert torch.equal(dst, want)
    into_b = b.clone()  # dst may be an operand itself
    combine(as_bytes(into_b), as_bytes(a), as_bytes(into_b))
    assert torch.equal(into_b, want)


def test_the_order_of_the_three_operand_form_is_a_then_b():
    # min(0.0, -0.0) is order-dependent (both are equal): the order shows in the sign bit
    combine = combiner_of(byte_reducer(R.MIN, torch.float32))
    assert combine is not None
    dst, plain = torch.tensor([1.0]), torch.tensor([0.0])
    combine(as_bytes(dst), as_bytes(plain), as_bytes(torch.tensor([-0.0])))
    reduce_into(plain, torch.tensor([-0.0]), R.MIN)
    assert torch.signbit(dst).item() == torch.signbit(plain).item()

"""Reductions lowered once: transports see a base op; PREMUL_SUM scales before, AVG divides
after, bit for bit as torch divides."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ringtorch._buffers import as_bytes
from ringtorch.collectives.lowering import lower, scale
from ringtorch.collectives.reduce_op import RedOpType as R


@pytest.mark.parametrize(("kind", "base"), [
    (R.SUM, R.SUM), (R.AVG, R.SUM), (R.PREMUL_SUM, R.SUM), (R.PRODUCT, R.PRODUCT),
    (R.MIN, R.MIN), (R.MAX, R.MAX),
])
def test_transports_see_only_base_ops(kind, base):
    low = lower(kind, torch.float32, "all_reduce", 3)
    assert (low.kind, low.base, low.itemsize) == (kind, base, 4)
    assert low.scales is (kind is R.PREMUL_SUM)
    assert (low.post is not None) is (kind is R.AVG)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.complex64])
def test_the_post_step_divides_like_torch_slice_by_slice_or_whole(dtype):
    x = (torch.randn(1000, dtype=torch.float64) * 100).to(dtype)
    want = x / 3
    whole, sliced = x.clone(), x.clone()
    post = lower(R.AVG, dtype, "all_reduce", 3).post
    assert post is not None
    post(as_bytes(whole))
    data = as_bytes(sliced)
    step = 40 * sliced.element_size()
    for a in range(0, data.nbytes, step):
        post(data[a:a + step])
    assert torch.equal(whole, want) and torch.equal(sliced, want)


def test_premul_sum_scales_in_place_or_into_a_copy():
    x = torch.tensor([1.0, -2.0, 4.0])
    copy = scale(x, 0.5, in_place=False)
    assert torch.equal(x, torch.tensor([1.0, -2.0, 4.0]))
    assert torch.equal(copy, torch.tensor([0.5, -1.0, 2.0]))
    scale(x, torch.tensor([2.0], dtype=torch.float64), in_place=True)
    assert x.dtype is torch.float32 and torch.equal(x, torch.tensor([2.0, -4.0, 8.0]))


def test_the_base_reducer_adds_for_avg():
    low = lower(R.AVG, torch.float32, "all_reduce", 2)
    a, b = np.array([1.0, 2.0], np.float32), np.array([3.0, 5.0], np.float32)
    low.reducer(a.view(np.uint8), b.view(np.uint8), False)
    assert a.tolist() == [4.0, 7.0]


@pytest.mark.parametrize(("kind", "dtype", "message"), [
    (R.AVG, torch.int32, r"all_reduce: ReduceOp.AVG needs a floating or complex dtype"),
    (R.BAND, torch.float32, r"Cannot use ReduceOp.BAND with non-integral dtype torch.float32"),
])
def test_meaningless_pairs_are_refused_when_lowered(kind, dtype, message):
    with pytest.raises(RuntimeError, match=message):
        lower(kind, dtype, "all_reduce", 2)

"""The backend door's translation of torch's option structs and ReduceOps into the engine's."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from ringtorch.c10d.options import reduce_op, translate
from ringtorch.collectives import options as engine
from ringtorch.collectives.reduce_op import RedOpType, premul_factor


@pytest.mark.parametrize("name", ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"])
def test_each_torch_reduce_op_becomes_the_engines_of_the_same_name(name: str) -> None:
    assert reduce_op(getattr(dist.ReduceOp, name)) is RedOpType[name]
    opts = dist.AllreduceOptions()
    opts.reduceOp = getattr(dist.ReduceOp, name)  # read back, torch gives a ReduceOp object
    assert reduce_op(opts.reduceOp) is RedOpType[name]


def test_premul_sum_keeps_torchs_factor_number_or_tensor() -> None:
    assert premul_factor(reduce_op(dist._make_nccl_premul_sum(2.5))) == 2.5
    factor = torch.tensor([0.5])
    assert torch.equal(premul_factor(reduce_op(dist._make_nccl_premul_sum(factor))), factor)


def test_something_else_than_a_reduce_op_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"^expected a ReduceOp such as ReduceOp.SUM, got 'sum'$"):
        reduce_op("sum")


def test_translation_reads_every_field_and_torchs_unset_timeout_means_the_groups() -> None:
    opts = dist.ReduceOptions()
    opts.reduceOp, opts.rootRank, opts.asyncOp = dist.ReduceOp.MAX, 2, False
    assert translate(engine.ReduceOptions, opts) == engine.ReduceOptions(
        reduceOp=RedOpType.MAX, rootRank=2, rootTensor=0, timeout=None, asyncOp=False)
    opts.timeout = timedelta(seconds=7)
    assert translate(engine.ReduceOptions, opts, async_op=True) == engine.ReduceOptions(
        reduceOp=RedOpType.MAX, rootRank=2, timeout=timedelta(seconds=7), asyncOp=True)


def test_equal_translations_share_one_frozen_instance_except_tensor_factors() -> None:
    a, b = dist.AllreduceOptions(), dist.AllreduceOptions()
    assert translate(engine.AllreduceOptions, a) is translate(engine.AllreduceOptions, b)
    a.reduceOp = dist._make_nccl_premul_sum(torch.tensor([2.0]))
    assert translate(engine.AllreduceOptions, a) is not translate(engine.AllreduceOptions, a)
    barrier = dist.BarrierOptions()
    barrier.device_ids = [0]  # a list: not shareable, still translated
    assert translate(engine.BarrierOptions, barrier).device_ids == [0]

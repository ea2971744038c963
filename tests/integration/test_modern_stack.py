"""torch's modern stack under ringtorch's paths runs on backend "ringtorch" and computes what
one process computes; operators without a DTensor sharding strategy run replicated when asked.

One job at world 2 (tests/integration/_modern_stack_ranks.py) imports DeviceMesh, FSDP2, tensor
parallel, DCP, functional collectives and DTensor from ``ringtorch.distributed.*`` only; every
expected value here is computed by torch on full tensors in this process.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from ringtorch.testing import run_ranks
from tests.integration import _modern_stack_ranks as R

WS = 2


@functools.cache
def _job(tmp: str) -> list[dict]:
    return run_ranks(R.stack, WS, args=(tmp,), timeout=120)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return _job(str(tmp_path_factory.mktemp("dcp")))


def _reference() -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One SGD step of the whole model on the whole batch (FSDP2 averages the halves' grads,
    so the loss here is the mean of the halves' losses), and the model's output."""
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    model = R._model()
    out = model(x).detach()
    loss = sum(model(half).square().sum() for half in x.chunk(WS)) / WS
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    return {k: v.detach() for k, v in model.state_dict().items()}, out


def test_fsdp2_tp_dcp_and_functional_collectives_match_one_process(results: list[dict]) -> None:
    state, out = _reference()
    for rank, res in enumerate(results):
        assert res["backend"] == "ringtorch" and res["fsdp2_is_module"]
        for name, ref in state.items():
            torch.testing.assert_close(res["fsdp2"][name], ref, msg=f"fsdp2 {name} rank {rank}")
            torch.testing.assert_close(res["dcp"][name], ref, rtol=0, atol=0,
                                       msg=f"dcp {name} rank {rank}")
        torch.testing.assert_close(torch.Tensor(res["tp"]), out)
        torch.testing.assert_close(res["fc"], torch.arange(3.0) * 3, rtol=0, atol=0)


def test_attention_without_a_strategy_runs_replicated_and_warns_once_per_operator(
        results: list[dict]) -> None:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=gen).requires_grad_() for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    (full * 3).sum().backward()
    for rank, res in enumerate(results):
        assert res["torch_refuses"] == ("Operator aten._scaled_dot_product_flash_attention_"
                                        "for_cpu.default does not have a sharding strategy "
                                        "registered.")
        is_dtensor, placements, local, gathered = res["sdpa"]
        assert is_dtensor and [str(p) for p in placements] == ["S(1)"]
        torch.testing.assert_close(gathered, full.detach())
        torch.testing.assert_close(local, full.detach()[:, 2 * rank:2 * rank + 2])
        for grad, ref in zip(res["sdpa_grads"], (q.grad, k.grad, v.grad), strict=True):
            torch.testing.assert_close(grad, ref)
        nbytes = 3 * q.numel() * q.element_size()  # q, k and v, each gathered in full
        assert res["warnings"][0] == (
            "DTensor operator aten._scaled_dot_product_flash_attention_for_cpu.default has no "
            f"sharding strategy: ringtorch ran it replicated (all-gathered its DTensor "
            f"arguments, replicated {nbytes} bytes) and re-sharded its outputs like its first "
            "DTensor argument")
        # two forwards, one backward: one warning per operator
        assert len(res["warnings"]) == 2
        assert res["warnings"][1].startswith("DTensor operator aten._scaled_dot_product_flash_"
                                             "attention_for_cpu_backward.default has no")


def test_fallback_refuses_operators_with_a_strategy_or_that_write_in_place() -> None:
    from ringtorch.distributed.tensor import enable_replicate_fallback

    aten = torch.ops.aten
    with pytest.raises(ValueError, match=r"^aten\.mm\.default has a sharding strategy of "
                       r"DTensor's already; the replicate fallback takes operators without one$"):
        enable_replicate_fallback(aten.mm.default)
    with pytest.raises(ValueError, match=r"^aten\.masked_fill_\.Scalar writes into its "
                       r"arguments; the replicate fallback runs only operators that return new "
                       r"tensors$"):
        enable_replicate_fallback(aten.masked_fill_.Scalar)
    from torch.distributed.tensor import DTensor

    assert aten.masked_fill_.Scalar not in DTensor._op_dispatcher._custom_op_handlers


def test_fallback_is_off_until_enabled_and_disable_takes_it_out() -> None:
    from torch.distributed.tensor import DTensor

    from ringtorch.distributed.tensor import (
        disable_replicate_fallback,
        enable_replicate_fallback,
    )

    handlers = DTensor._op_dispatcher._custom_op_handlers
    attention = [torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
                 torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default]
    assert not any(op in handlers for op in attention)  # importing our path changed nothing
    enable_replicate_fallback()
    enable_replicate_fallback()  # twice is once
    assert all(op in handlers for op in attention)
    disable_replicate_fallback()
    assert not any(op in handlers for op in attention)

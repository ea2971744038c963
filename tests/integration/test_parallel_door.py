"""Tensor, sequence and pipeline parallelism of torch on backend "ringtorch" compute what the
whole module computes in one process.

One job at world 2 and one at world 3 (tests/integration/_parallel_door_ranks.py):
``parallelize_module`` with ColwiseParallel/RowwiseParallel on an MLP and with
SequenceParallel around a transformer block's MLP, forward and backward; then
``torch.distributed.pipelining``'s GPipe and 1F1B schedules on one stage per rank over four
Linear layers, four microbatches. Expected values: the same modules, whole, on the whole
batch here.
"""

from __future__ import annotations

import functools

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _parallel_door_ranks as R


@functools.cache
def _job(ws: int) -> list[dict]:
    return run_ranks(R.parallel, ws, timeout=120)


# world 3: three pipeline stages, the last with one Linear layer
@pytest.fixture(scope="module", params=[2, 3], ids=["world2", "world3"])
def results(request: pytest.FixtureRequest) -> list[dict]:
    return _job(request.param)


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in module.named_parameters()}


def test_colwise_and_rowwise_parallel_equal_the_whole_mlp(results: list[dict]) -> None:
    net = R.mlp()
    y = net(R.data(10, 6, 8))
    y.square().sum().backward()
    for rank, res in enumerate(results):
        assert res["backend"] == "ringtorch"
        out, grads = res["tp"]
        torch.testing.assert_close(out, y.detach(), msg=f"rank {rank}")
        for name, ref in _grads(net).items():
            torch.testing.assert_close(grads[name], ref, msg=f"{name} rank {rank}")


def test_sequence_parallel_block_equals_the_whole_block(results: list[dict]) -> None:
    block = R.Block()
    x = R.data(11, 2, 6, 8)
    out = block(x)
    out.square().sum().backward()  # the ranks' losses are the sums over their slices
    for rank, res in enumerate(results):
        kind, local, grads = res["sp"]
        assert kind == "Tensor"
        torch.testing.assert_close(local, out.detach().chunk(len(results), dim=1)[rank])
        for name, ref in _grads(block).items():
            torch.testing.assert_close(grads[name], ref, msg=f"{name} rank {rank}")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_schedule_equals_the_whole_model(results: list[dict], schedule: str) -> None:
    net = R.deep()
    x, target = R.data(20, 8, 8), R.data(21, 8, 4)
    losses = [torch.nn.functional.mse_loss(net(xm), tm)
              for xm, tm in zip(x.chunk(R.MICROBATCHES), target.chunk(R.MICROBATCHES),
                                strict=True)]
    # torch's schedules divide the accumulated grads by the number of microbatches
    (sum(losses) / R.MICROBATCHES).backward()
    ref = _grads(net)
    seen = set()
    for res in results:
        got = res[schedule]
        for name, grad in got["grads"].items():
            index, param = name.split(".")
            full = f"{got['first_layer'] + int(index)}.{param}"
            torch.testing.assert_close(grad, ref[full], msg=full)
            seen.add(full)
    assert seen == set(ref)  # every layer's grads, from one stage or the other
    last = results[-1][schedule]
    torch.testing.assert_close(last["losses"], [loss.item() for loss in losses])
    torch.testing.assert_close(last["output"], net(x).detach())
    assert results[0][schedule]["losses"] == []

"""DDP inside distributed autograd (2 real ranks): the gradients in each rank's context are the
average over the ranks, as torch's engine gives them (it runs DDP's hooks on the gradients it
captures); ``.grad`` is left as it was; a context's gradients survive the next iteration even
when DDP's gradients are views of its buckets. Expected values: plain torch, one process."""

from __future__ import annotations

import pytest
import torch

from ringtorch.testing import run_ranks
from ringtorch.testing.harness import job_port
from tests.integration import _dist_autograd_ddp_ranks as R


def _mean_grads(step: int) -> list[torch.Tensor]:
    net = R.model()
    total = [torch.zeros_like(p) for p in net.parameters()]
    for rank in (0, 1):
        loss = net(R.batch(rank, step)).pow(2).sum()
        grads = torch.autograd.grad(loss, list(net.parameters()))
        total = [t + g / 2 for t, g in zip(total, grads, strict=True)]
    return total


@pytest.mark.parametrize("as_view", [False, True])
def test_context_gradients_are_ddps_average_and_grad_is_left_alone(as_view: bool) -> None:
    results = run_ranks(R.scenario, 2, args=(job_port(), as_view), timeout=90)
    for rank, out in enumerate(results):
        for step, grads in enumerate(out["steps"]):
            for got, exp in zip(grads, _mean_grads(step), strict=True):
                torch.testing.assert_close(got, exp, msg=f"rank {rank}")
        for got, exp in zip(out["kept"], _mean_grads(0), strict=True):  # after step 1
            torch.testing.assert_close(got, exp, msg=f"rank {rank}")
        assert out["grad_untouched"], f"rank {rank}"

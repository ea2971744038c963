"""DistributedOptimizer with two trainers stepping one parameter server's module at the same
time (3 real workers): the server's SGD update is the sum of both trainers' updates, and each
trainer's local parameter follows its own gradient. Expected values are computed here with
plain torch."""

from __future__ import annotations

import functools

import torch

from ringtorch.testing import run_ranks
from tests.integration import _dist_autograd_ranks as R


@functools.cache
def results() -> list[dict]:
    return run_ranks(R.optim_scenario, 3, timeout=60)


def _expected() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    model = R.Linear(7)
    params = list(model.parameters())
    total = [torch.zeros_like(p) for p in params]
    locals_after = []
    for rank in (0, 1):
        local = torch.ones(3, requires_grad=True)
        y = model(torch.full((1, 3), float(rank + 1)) * local).sum()
        *grads, local_grad = torch.autograd.grad(y, params + [local])
        total = [t + g for t, g in zip(total, grads, strict=True)]
        locals_after.append(local.detach() - 0.5 * local_grad)
    return [p.detach() - 0.5 * t for p, t in zip(params, total, strict=True)], locals_after


def test_concurrent_steps_on_the_server_sum_up() -> None:
    ps_after, _ = _expected()
    for rank in (0, 1):
        for got, exp in zip(results()[rank]["ps_after"], ps_after, strict=True):
            torch.testing.assert_close(got, exp)


def test_local_parameters_follow_their_trainers_gradients() -> None:
    _, locals_after = _expected()
    for rank in (0, 1):
        torch.testing.assert_close(results()[rank]["local"], locals_after[rank])
    assert results()[2] == {}


def test_step_on_an_unknown_context_fails() -> None:
    for rank in (0, 1):
        assert results()[rank]["unknown"] == (
            "RuntimeError", "Could not find autograd context with id: 999")

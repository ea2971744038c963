"""Distributed autograd across 3 real workers: gradients cross workers (nested calls too),
land in the context and never in ``.grad``, reused remote modules get summed gradients,
tensors without grad are not recorded, contexts are released everywhere, errors as in torch.
Expected gradients are computed here with plain torch in one process."""

from __future__ import annotations

import functools

import torch

from ringtorch.testing import run_ranks
from tests.integration import _dist_autograd_ranks as R


@functools.cache
def root() -> dict:
    return run_ranks(R.autograd_scenario, 3, timeout=60)[0]


def test_backward_crosses_workers_through_nested_calls() -> None:
    out = root()
    x = out["x"].clone().requires_grad_(True)
    loss = ((torch.sin(2 * (x * 3)) + x) * (x * x)).sum()
    (expected,) = torch.autograd.grad(loss, [x])
    torch.testing.assert_close(out["grads_x"], expected)
    assert out["x_grad_attr"] is None


def test_remote_module_used_twice_gets_the_summed_gradient() -> None:
    out = root()
    model = R.Linear(5)
    x = out["x_input"]
    model(model(x) * 2).sum().backward()
    *grads, dot_grads = out["module_grads"]
    for got, param in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(got, param.grad)
    assert dot_grads == [None, None]


def test_contexts_are_released_on_every_worker() -> None:
    out = root()
    assert out["released_here"] is True
    assert out["released_remote"] == [False, False]
    assert out["ctx_id"] >> 48 == 0  # the id carries the creating worker


def test_tensors_without_grad_are_not_recorded() -> None:
    out = root()
    assert out["record_plain"] == (0, 0)   # (sends, receives) on worker1
    assert out["record_grad"] == (1, 1)    # the reply y, the received w


def test_retain_graph_accumulates_and_a_third_backward_fails() -> None:
    out = root()
    torch.testing.assert_close(out["twice"], torch.full((3,), 4.0))  # 2 * d(w*w)/dw at 1
    name, message = out["third"]
    assert name == "RuntimeError"
    assert "Trying to backward through the graph a second time" in message


def test_errors_as_in_torch() -> None:
    out = root()
    assert out["not_scalar"] == ("RuntimeError",
                                 " is not a scalar, all roots need to be scalar")
    assert out["no_grad_root"] == ("RuntimeError", "requires_grad not set on root")
    assert out["unknown"] == ("RuntimeError", "Could not find autograd context with id: 12345")
    assert out["unknown_get"] == out["unknown"]


@functools.cache
def rref_backward() -> dict:
    return run_ranks(R.rref_backward_scenario, 2, timeout=60)[0]


def test_rref_backward_with_a_context_runs_the_distributed_pass_from_the_owner() -> None:
    # d/dt sum(t^2) = 2t, delivered into the caller's context, never into .grad
    assert torch.equal(rref_backward()["distributed"], torch.tensor([2.0, 4.0, 6.0]))
    assert rref_backward()["grad_untouched"]


def test_rref_backward_without_a_context_is_a_local_backward_on_the_owner() -> None:
    assert torch.equal(rref_backward()["local"], torch.tensor([27.0, 3.0]))  # 3 x^2


def test_rref_backward_errors() -> None:
    name, message = rref_backward()["not_owner"]
    assert name == "RuntimeError"
    assert "only the owner (worker1) may run" in message, message
    name, message = rref_backward()["not_a_tensor"]
    assert name == "RuntimeError" and "RRef should contain a tensor for .backward()" in message
    name, message = rref_backward()["unknown_context"]
    assert "Could not find autograd context with id: 12345" in message, message

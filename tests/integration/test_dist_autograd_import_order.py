"""Distributed autograd needs no import in advance: workers that never imported
``ringtorch.distributed.autograd`` take part in a distributed backward (the RPC agent loads it
on the first message that carries a context), as torch's workers do. Three real workers: the
caller imports distributed autograd only after its first RPC; workers 1 and 2 never import it.
The gradients are compared with the same computation in one process with plain torch.

This module must not import distributed autograd itself: every worker imports it to load the
functions called over RPC.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import torch

import ringtorch.distributed.rpc as rpc
from ringtorch.testing import run_ranks
from tests.integration._rpc_common import start

AUTOGRAD = "ringtorch.distributed.autograd"
X = [0.5, -1.0, 2.0]
W = [1.5, 0.25, -0.75]   # worker1's parameter
V = [2.0, -0.5, 1.0]     # worker2's parameter
_params: dict[str, torch.Tensor] = {}


def _param(name: str, values: list[float]) -> torch.Tensor:
    if name not in _params:
        _params[name] = torch.tensor(values, requires_grad=True)
    return _params[name]


def autograd_loaded() -> bool:
    return AUTOGRAD in sys.modules


def scale_on_worker2(x: torch.Tensor) -> torch.Tensor:
    return x * _param("v", V)


def forward_on_worker1(x: torch.Tensor) -> torch.Tensor:
    """sin(W * (V * x)), V * x computed on worker2 (a nested call from a served request)."""
    return torch.sin(_param("w", W) * rpc.rpc_sync("worker2", scale_on_worker2, args=(x,)))


def param_grad(name: str, context_id: int) -> torch.Tensor:
    dist_autograd = importlib.import_module(AUTOGRAD)  # loaded already: the agent did it
    grad: torch.Tensor = dist_autograd.get_gradients(context_id)[_params[name]]
    return grad


def scenario(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {"imported_at_start": autograd_loaded()}
    start(rank, world_size)
    if rank == 0:
        out["first_call"] = [rpc.rpc_sync(f"worker{r}", autograd_loaded) for r in (1, 2)]
        dist_autograd = importlib.import_module(AUTOGRAD)
        x = torch.tensor(X, requires_grad=True)
        with dist_autograd.context() as cid:
            y = rpc.rpc_sync("worker1", forward_on_worker1, args=(x,))
            loss = (y * y).sum()
            dist_autograd.backward(cid, [loss])
            out["loss"] = loss.item()
            out["grad_x"] = dist_autograd.get_gradients(cid)[x]
            out["loaded_after"] = [rpc.rpc_sync(f"worker{r}", autograd_loaded) for r in (1, 2)]
            out["grad_w"] = rpc.rpc_sync("worker1", param_grad, args=("w", cid))
            out["grad_v"] = rpc.rpc_sync("worker2", param_grad, args=("v", cid))
    rpc.shutdown()
    return out


def test_workers_that_never_imported_distributed_autograd_compute_the_right_gradients() -> None:
    results = run_ranks(scenario, 3, timeout=60)
    assert [out["imported_at_start"] for out in results] == [False, False, False]
    out = results[0]
    assert out["first_call"] == [False, False]  # plain RPCs load nothing
    assert out["loaded_after"] == [True, True]  # the first stamped message did
    x = torch.tensor(X, requires_grad=True)
    w = torch.tensor(W, requires_grad=True)
    v = torch.tensor(V, requires_grad=True)
    loss = (torch.sin(w * (v * x)) ** 2).sum()
    grad_x, grad_w, grad_v = torch.autograd.grad(loss, [x, w, v])
    assert abs(out["loss"] - loss.item()) < 1e-6
    torch.testing.assert_close(out["grad_x"], grad_x)
    torch.testing.assert_close(out["grad_w"], grad_w)
    torch.testing.assert_close(out["grad_v"], grad_v)

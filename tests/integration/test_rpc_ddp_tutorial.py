"""torch's RPC + DDP tutorial (tests/integration/_rpc_ddp_tutorial.py: a master, a parameter
server holding an EmbeddingBag through RemoteModule, two trainers with a local Linear under
DDP, DistributedOptimizer, a distributed autograd context per step) trains under ringtorch as
under torch: the same losses and trained parameters as torch's own run of the program, and as
the same training computed in one process with plain torch; DDP keeps the trainers' Linear
layers identical, and the loss falls.

The parameter server applies the two trainers' updates in whichever order they arrive, so
runs may differ in the last bits (``a - x - y`` against ``a - y - x``): compared with a
tolerance, not bit for bit.
"""

from __future__ import annotations

import functools

import torch

from ringtorch.testing import run_ranks
from ringtorch.testing.harness import job_port
from tests.integration import _rpc_ddp_tutorial as T

TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}


@functools.cache
def _run(library: str) -> dict:
    return run_ranks(T.run_worker, 4, args=(library, job_port()), timeout=240)[2]


def _trained(result: dict) -> list[torch.Tensor]:
    return [*result["embedding"], *result["trainers"][0]["fc"]]


def test_trained_parameters_and_losses_are_torchs() -> None:
    ours, theirs = _run("ringtorch"), _run("torch")
    for got, want in zip(_trained(ours), _trained(theirs), strict=True):
        torch.testing.assert_close(got.detach(), want.detach(), **TOLERANCE)
    for rank in (0, 1):
        torch.testing.assert_close(ours["trainers"][rank]["losses"],
                                   theirs["trainers"][rank]["losses"], **TOLERANCE)


def test_training_equals_the_single_process_reference() -> None:
    ours, reference = _run("ringtorch"), T.reference()
    for got, want in zip(_trained(ours), [*reference["embedding"], *reference["fc"]],
                         strict=True):
        torch.testing.assert_close(got.detach(), want, **TOLERANCE)
    for rank in (0, 1):
        torch.testing.assert_close(ours["trainers"][rank]["losses"], reference["losses"][rank],
                                   **TOLERANCE)


def test_ddp_keeps_the_trainers_linear_layers_identical() -> None:
    first, second = (t["fc"] for t in _run("ringtorch")["trainers"])
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], T.seeded_linear().weight)  # and they did train


def test_the_loss_falls_epoch_after_epoch() -> None:
    for trainer in _run("ringtorch")["trainers"]:
        per_epoch = torch.tensor(trainer["losses"]).reshape(T.EPOCHS, T.BATCHES).mean(dim=1)
        assert (per_epoch[1:] < per_epoch[:-1]).all(), per_epoch


def test_gradients_stay_out_of_grad_as_in_torch() -> None:
    for library in ("torch", "ringtorch"):
        for trainer in _run(library)["trainers"]:
            assert trainer["grads_after_backward"] == [None, None], library

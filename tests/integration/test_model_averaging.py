"""Post-local SGD, periodic and hierarchical model averaging give torch's parameters.

The same rank programs (tests/integration/_comm_hooks_ranks.py) run under torch.distributed
(gloo) and ringtorch.distributed at world 4, where pairs of ranks form the subgroups; the
parameters every rank ends with must agree. The constructors' errors and warnings are compared
with torch's word for word.
"""

from __future__ import annotations

import functools

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _comm_hooks_ranks as ranks

STEPS = 7


@functools.cache
def _post_local(package: str, wrapper: bool) -> list[dict]:
    return run_ranks(ranks.post_local_sgd, 4, args=(package, wrapper, STEPS), timeout=120)


@functools.cache
def _hierarchical(package: str) -> list[dict]:
    return run_ranks(ranks.hierarchical, 4, args=(package, STEPS), timeout=120)


def _close(ours: torch.Tensor, theirs: torch.Tensor, where: str) -> None:
    # four ranks' sums may be added in another order than gloo's: a few ulps
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6, msg=lambda m: f"{where}: {m}")


@pytest.mark.parametrize("wrapper", [True, False], ids=["PostLocalSGDOptimizer", "by-hand"])
def test_post_local_sgd_with_periodic_averaging_matches_torch(wrapper: bool) -> None:
    theirs, ours = _post_local("torch", wrapper), _post_local("ringtorch", wrapper)
    for rank in range(4):
        for key, value in theirs[rank]["params"].items():
            _close(ours[rank]["params"][key], value, f"rank {rank} {key}")
        assert ours[rank]["hook_iter"] == theirs[rank]["hook_iter"] == 2
        assert ours[rank]["averager_step"] == theirs[rank]["averager_step"] == STEPS


def test_post_local_sgd_ranks_differ_between_averagings_and_agree_after() -> None:
    # STEPS - 1 = 6 is an averaging step (warm-up 2, period 2): everyone agrees at the end
    ours = _post_local("ringtorch", True)
    for rank in range(1, 4):
        for key, value in ours[0]["params"].items():
            _close(ours[rank]["params"][key], value, f"rank {rank} {key}")


def test_post_local_sgd_optimizer_state_dict_carries_the_averager_step() -> None:
    theirs, ours = _post_local("torch", True), _post_local("ringtorch", True)
    for rank in range(4):
        assert ours[rank]["saved_step"] == theirs[rank]["saved_step"] == STEPS
        assert ours[rank]["restored_step"] == STEPS
        for mine, torchs in zip(ours[rank]["restored_momentum"],
                                theirs[rank]["restored_momentum"], strict=True):
            _close(mine, torchs, f"rank {rank} momentum")


def test_hierarchical_averager_matches_torch_at_every_step() -> None:
    theirs, ours = _hierarchical("torch"), _hierarchical("ringtorch")
    for rank in range(4):
        for step, (mine, torchs) in enumerate(zip(ours[rank]["snapshots"],
                                                  theirs[rank]["snapshots"], strict=True)):
            for a, b in zip(mine, torchs, strict=True):
                _close(a, b, f"rank {rank} step {step}")
        for key in ("after_periodic", "after_world"):
            for a, b in zip(ours[rank][key], theirs[rank][key], strict=True):
                _close(a, b, f"rank {rank} {key}")


def test_hierarchical_averager_averages_pairs_then_everyone() -> None:
    ours = _hierarchical("ringtorch")
    # step 2: pairs {0,1} and {2,3} averaged; step 4: all four (warm-up 1, periods 2 and 4)
    pair_step, world_step = ours[0]["snapshots"][2], ours[0]["snapshots"][4]
    assert all(torch.equal(a, b) for a, b in zip(pair_step, ours[1]["snapshots"][2], strict=True))
    assert not all(torch.equal(a, b)
                   for a, b in zip(pair_step, ours[2]["snapshots"][2], strict=True))
    for rank in range(1, 4):
        for a, b in zip(world_step, ours[rank]["snapshots"][4], strict=True):
            _close(b, a, f"rank {rank}")


def test_errors_and_warnings_are_torchs_word_for_word() -> None:
    theirs = run_ranks(ranks.error_messages, 2, args=("torch",), timeout=60)[0]
    ours = run_ranks(ranks.error_messages, 2, args=("ringtorch",), timeout=60)[0]
    assert ours == theirs
    assert ours["period<1"] == "ValueError: Arg ``period`` must be a positive value."
    assert ours["warmup<0"] == "ValueError: Arg ``warmup_steps`` must be a non-negative number."
    assert ours["powersgd-start"].startswith("ValueError: Expect `start_powerSGD_iter` > 1")
    assert ours["register-twice"] == ("RuntimeError: register_comm_hook or "
                                      "register_builtin_comm_hook can only be called once.")


def test_powersgd_rank_below_one_is_refused() -> None:
    from ringtorch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    with pytest.raises(ValueError, match=r"^`matrix_approximation_rank` must be a positive "
                                         r"integer, got 0$"):
        PowerSGDState(None, matrix_approximation_rank=0)

"""ZeroRedundancyOptimizer trains, shards and saves exactly as torch's does.

Every program (tests/integration/_zero_ranks.py) runs twice, under torch.distributed (gloo) with
torch's ZeroRedundancyOptimizer and DDP, and under ringtorch; the ranks' parameters, partitions,
state dicts and error messages must agree. Gradient all_reduces may sum in another order, so
parameters are compared to fp tolerance; partitions and messages must be equal.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _zero_ranks as R

CASES = [("adam", False), ("adam", True), ("sgd", False), ("sgd", True)]


def _close(theirs: Any, ours: Any, where: str) -> None:
    if isinstance(theirs, torch.Tensor):
        torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5,
                                   msg=lambda m: f"{where}: {m}")
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs), where
        for key in theirs:
            _close(theirs[key], ours[key], f"{where}.{key}")
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(theirs, ours, strict=True)):
            _close(a, b, f"{where}[{i}]")
    else:
        assert ours == theirs, f"{where}: torch {theirs!r}, ringtorch {ours!r}"


@functools.cache
def _trained(world_size: int) -> tuple[list[Any], list[Any]]:
    theirs = run_ranks(R.train, world_size, args=("torch", CASES), timeout=120)
    ours = run_ranks(R.train, world_size, args=("ringtorch", CASES), timeout=120)
    return theirs, ours


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{o}-bucket_view={b}" for o, b in CASES])
def test_zero_with_ddp_trains_to_torchs_parameters(world_size: int, case: int) -> None:
    theirs, ours = _trained(world_size)
    for rank in range(world_size):
        _close(theirs[rank][case]["state"], ours[rank][case]["state"], f"rank {rank}")
        _close(theirs[0][case]["state"], ours[rank][case]["state"], f"rank {rank} vs rank 0")


@pytest.mark.parametrize("world_size", [2, 3])
def test_partition_is_torchs_and_each_rank_holds_only_its_shards_state(world_size: int) -> None:
    theirs, ours = _trained(world_size)
    for rank in range(world_size):
        for case in range(len(CASES)):
            assert ours[rank][case]["partition"] == theirs[rank][case]["partition"]
            assert ours[rank][case]["local_state_numel"] == theirs[rank][case][
                "local_state_numel"]
    net = R.make_net()
    params = list(net.parameters())
    owned = [sum(params[i].numel() for group in ours[0][0]["partition"][r] for i in group)
             for r in range(world_size)]
    assert sum(owned) == sum(p.numel() for p in params)
    assert max(owned) < sum(owned) * 0.75  # sharded, not all on one rank


@pytest.fixture(scope="module")
def consolidated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("zero")
    paths = {name: str(folder / f"{name}.pt") for name in ("torch", "ringtorch")}
    return {name: (run_ranks(R.consolidate, 2, args=(name, paths[name]), timeout=120), path)
            for name, path in paths.items()}


def test_state_dict_consolidated_to_rank_1_equals_torchs(consolidated: dict[str, Any]) -> None:
    theirs = consolidated["torch"][0][1]["state_dict"]
    ours = consolidated["ringtorch"][0][1]["state_dict"]
    assert sorted(ours["state"]) == list(range(8))
    _close(theirs, ours, "state_dict")


def test_state_dict_on_another_rank_raises_torchs_error(consolidated: dict[str, Any]) -> None:
    theirs, ours = consolidated["torch"][0][0], consolidated["ringtorch"][0][0]
    assert ours["other_rank"] == theirs["other_rank"]
    assert ours["other_rank"] == (
        "RuntimeError", "Optimizer state has not been consolidated on this rank. Please call "
        "`consolidate_state_dict(to=0)` on all ranks beforehand if you meant to save the global "
        "state.")


def test_state_dict_before_consolidating_raises_torchs_error(consolidated: dict[str, Any]
                                                             ) -> None:
    for rank in range(2):
        theirs = consolidated["torch"][0][rank]["before"]
        assert consolidated["ringtorch"][0][rank]["before"] == theirs
        assert theirs[1].startswith(f"Optimizer state has not been consolidated on this rank. "
                                    f"Please call `consolidate_state_dict(to={rank})`")


def test_loading_a_mismatched_state_dict_raises_torchs_errors(consolidated: dict[str, Any]
                                                              ) -> None:
    for rank in range(2):
        theirs = consolidated["torch"][0][rank]
        ours = consolidated["ringtorch"][0][rank]
        assert ours["fewer_groups"] == theirs["fewer_groups"] == (
            "ValueError", "loaded state dict has a different number of parameter groups")
        assert ours["group_size"] == theirs["group_size"] == (
            "ValueError", "loaded state dict contains a parameter group that doesn't match "
                          "the size of optimizer's group")


def test_consolidating_to_a_rank_outside_the_group_is_refused(consolidated: dict[str, Any]
                                                              ) -> None:
    for rank in range(2):
        assert consolidated["ringtorch"][0][rank]["bad_to"] == (
            "ValueError", "consolidate_state_dict(to=2): the group has ranks 0 to 1")


@pytest.mark.parametrize("saved_by", ["torch", "ringtorch"])
def test_state_dict_consolidated_at_world_2_loads_at_world_3_as_torchs(
        consolidated: dict[str, Any], saved_by: str) -> None:
    path = consolidated[saved_by][1]
    theirs = run_ranks(R.load_elsewhere, 3, args=("torch", path), timeout=120)
    ours = run_ranks(R.load_elsewhere, 3, args=("ringtorch", path), timeout=120)
    for rank in range(3):
        _close(theirs[rank]["state"], ours[rank]["state"], f"rank {rank}")
        assert ours[rank]["loaded_lr"] == theirs[rank]["loaded_lr"] == [0.01, 0.02]
    _close(theirs[0]["state_dict"], ours[0]["state_dict"], "state_dict after reloading")


@pytest.mark.parametrize("bucket_view", [False, True])
def test_add_param_group_shards_the_new_group_as_torch(bucket_view: bool) -> None:
    theirs = run_ranks(R.add_group, 3, args=("torch", bucket_view), timeout=120)
    ours = run_ranks(R.add_group, 3, args=("ringtorch", bucket_view), timeout=120)
    for rank in range(3):
        assert ours[rank]["partition"] == theirs[rank]["partition"]
        assert ours[rank]["lrs"] == theirs[rank]["lrs"] == [0.05, 0.02]
        _close(theirs[rank]["state"], ours[rank]["state"], f"rank {rank}")


@pytest.mark.parametrize("lengths,optimizer,bucket_view", [
    ([2, 4], "adam", False),
    ([3, 1, 2], "sgd", True),
    ([1, 3, 2, 3], "adam", True),
])
def test_uneven_inputs_under_join_finish_and_agree_with_torch(lengths: list[int], optimizer: str,
                                                              bucket_view: bool) -> None:
    args = (lengths, optimizer, bucket_view)
    theirs = run_ranks(R.uneven, len(lengths), args=("torch", *args), timeout=120)
    ours = run_ranks(R.uneven, len(lengths), args=("ringtorch", *args), timeout=120)
    for rank in range(len(lengths)):
        _close(theirs[rank]["state"], ours[rank]["state"], f"rank {rank}")


def test_process_group_shards_over_that_group_only_as_torch() -> None:
    theirs = run_ranks(R.subgroup, 3, args=("torch",), timeout=120)
    ours = run_ranks(R.subgroup, 3, args=("ringtorch",), timeout=120)
    assert ours[0] is None and theirs[0] is None
    for rank in (1, 2):
        assert ours[rank]["partition"] == theirs[rank]["partition"]
        assert len(ours[rank]["partition"]) == 2
        _close(theirs[rank]["state"], ours[rank]["state"], f"rank {rank}")
    _close(theirs[2]["state_dict"], ours[2]["state_dict"], "state_dict on group rank 1")


@pytest.mark.parametrize("bucket_view", [False, True])
def test_freezing_a_parameter_mid_training_matches_torch(bucket_view: bool) -> None:
    theirs = run_ranks(R.freeze, 2, args=("torch", bucket_view), timeout=120)
    ours = run_ranks(R.freeze, 2, args=("ringtorch", bucket_view), timeout=120)
    for rank in range(2):
        _close(theirs[rank]["state"], ours[rank]["state"], f"rank {rank}")


def test_a_rank_outside_the_process_group_gets_torchs_error() -> None:
    theirs = run_ranks(R.non_member, 2, args=("torch",), timeout=120)
    ours = run_ranks(R.non_member, 2, args=("ringtorch",), timeout=120)
    assert ours == theirs == [None, ("ValueError", "Group rank -1 is not part of group -100")]

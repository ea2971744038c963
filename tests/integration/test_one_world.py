"""One world: groups made through ``ringtorch.distributed`` are torch's groups too, and the
backend door's groups are the facade's.

One job at world 2 (tests/integration/_one_world_ranks.py) runs a program written against
``ringtorch.distributed.*`` paths only: it initializes through
``ringtorch.distributed.init_process_group`` and runs torch's DeviceMesh (1-D and 2-D, named
dimensions, a mesh on a subgroup), DTensor, a functional collective with autograd, FSDP2
training and DCP on that group; destroys it and initializes again; then initializes through
``torch.distributed.init_process_group("ringtorch")`` and uses those groups through the facade.
Every expected value is computed here by torch on one process.
"""

from __future__ import annotations

import functools

import pytest
import torch

from ringtorch.testing import free_port, run_ranks
from tests.integration import _one_world_ranks as R

WS = 2
X = torch.arange(24.0).reshape(4, 6)


@functools.cache
def _job(tmp: str) -> list[dict]:
    return run_ranks(R.program, WS, args=(tmp, free_port()), timeout=120)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return _job(str(tmp_path_factory.mktemp("dcp")))


def _trained() -> dict[str, torch.Tensor]:
    """Two SGD steps of the whole model; FSDP2 averages the ranks' gradients, so the loss is
    the mean of the halves' losses."""
    model = R.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        (sum(model(half).square().sum() for half in R.batch().chunk(WS)) / WS).backward()
        opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_torch_sees_the_facades_default_group_and_its_meshes(results: list[dict]) -> None:
    for rank, res in enumerate(results):
        assert res["torch_sees"] == (True, "ringtorch", rank, WS)
        assert res["mesh2"] == (1, WS, [0, 1], [rank])
        local, replicated, by_column = res["dtensor"]
        torch.testing.assert_close(local, X.chunk(WS)[rank], rtol=0, atol=0)
        torch.testing.assert_close(replicated, X, rtol=0, atol=0)
        torch.testing.assert_close(by_column, X.chunk(WS, dim=1)[rank], rtol=0, atol=0)
        local2, full2 = res["dtensor2"]
        torch.testing.assert_close(local2, X.chunk(WS, dim=1)[rank], rtol=0, atol=0)
        torch.testing.assert_close(full2, X, rtol=0, atol=0)


def test_a_functional_collective_differentiates_on_the_facades_group(
        results: list[dict]) -> None:
    inputs = [torch.arange(3.0) * (r + 1) for r in range(WS)]
    weights = [torch.arange(3.0 * WS) + r for r in range(WS)]  # rank r's loss weights
    for rank, res in enumerate(results):
        gathered, grad = res["fc"]
        torch.testing.assert_close(gathered, torch.cat(inputs), rtol=0, atol=0)
        # the gradient of an all-gather is the sum of every rank's slice for this rank
        torch.testing.assert_close(grad, sum(w[3 * rank:3 * rank + 3] for w in weights))


def test_fsdp2_training_and_dcp_on_the_facades_group_match_one_process(
        results: list[dict]) -> None:
    state = _trained()
    for rank, res in enumerate(results):
        for name, ref in state.items():
            torch.testing.assert_close(res["fsdp2"][name], ref, msg=f"fsdp2 {name} rank {rank}")
            torch.testing.assert_close(res["dcp"][name], res["fsdp2"][name], rtol=0, atol=0,
                                       msg=f"dcp {name} rank {rank}")


def test_the_facades_new_group_is_torchs_group_and_names_follow_one_counter(results: list[dict]) -> None:
    for rank, res in enumerate(results):
        # "0" the default; the 2-D mesh's "pp" groups [0] and [1] are "1" and "2"; then the
        # facade's new_group "3" (torch's name for it too) and torch's new_group "4"
        assert res["names"] == (str(rank + 1), "3", "4", "0", "3")
        y, torch_rank, our_rank, our_rank_of_torchs, full = res["sub_mesh"]
        # [1] and [2] summed through the facade, then the result summed through torch
        torch.testing.assert_close(y, torch.full((2,), 6.0), rtol=0, atol=0)
        assert (torch_rank, our_rank, our_rank_of_torchs) == (rank, rank, rank)
        torch.testing.assert_close(full, X, rtol=0, atol=0)  # a DeviceMesh on the facade's
        # new_subgroups(1): groups [0] "5" and [1] "6"
        assert res["subgroups"] == ([rank], str(5 + rank))


def test_both_doors_run_on_one_group_object(results: list[dict]) -> None:
    for rank, res in enumerate(results):
        torch_rank, our_rank, torch_size, our_size, z = res["same_group"]
        assert (torch_rank, our_rank, torch_size, our_size) == (rank, rank, WS, WS)
        # [1] and [2] summed through the facade, then the result summed through torch
        torch.testing.assert_close(z, torch.full((2,), 6.0), rtol=0, atol=0)


def test_after_destroy_both_worlds_are_empty_and_torchs_stack_says_what_to_do(
        results: list[dict]) -> None:
    for res in results:
        torch_init, our_init, mesh_error, dtensor_error = res["after_destroy"]
        assert (torch_init, our_init) == (False, False)
        assert mesh_error == (
            "RuntimeError: init_device_mesh needs a default process group: call "
            "ringtorch.distributed.init_process_group() first (after destroy_process_group(), "
            "call it again, and make meshes, DTensors and sharded models anew)")
        # a DTensor made before the destroy: torch's words, as after torch's own destroy
        assert dtensor_error == ("RuntimeError: Could not resolve the process group "
                                 "registered under the name 0")
        torch.testing.assert_close(res["reinit"], X, rtol=0, atol=0)


def test_the_backend_doors_groups_work_through_the_facade(results: list[dict]) -> None:
    for rank, res in enumerate(results):
        *ids, w, b = res["door"]
        assert ids == [rank, WS, rank, [0, 1], "ringtorch"]
        torch.testing.assert_close(w, torch.full((2,), 3.0), rtol=0, atol=0)
        torch.testing.assert_close(b, torch.full((2,), 1.0), rtol=0, atol=0)  # rank 1's


def test_the_doors_shrink_sends_a_facade_group_to_the_facades_shrink(
        results: list[dict]) -> None:
    for res in results:
        assert res["door_shrink"] == (
            "TypeError: process group '0' was made by ringtorch.distributed: shrink it with "
            "ringtorch.distributed.shrink_group")

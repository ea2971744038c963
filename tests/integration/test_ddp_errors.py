"""DDP's construction-time synchronisation and its error paths, messages matched exactly."""

from __future__ import annotations

import functools
import re

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _ddp_ranks as ranks


@functools.cache
def _errors() -> list[dict[str, str]]:
    return run_ranks(ranks.errors, 2, timeout=60)


@functools.cache
def _construction() -> list[dict]:
    return run_ranks(ranks.construction, 3, timeout=60)


def test_parameters_and_buffers_are_broadcast_from_rank_zero_at_construction():
    results = _construction()
    for rank, result in enumerate(results):
        for name, value in result["after_init"].items():
            torch.testing.assert_close(value, results[0]["after_init"][name],
                                       msg=lambda m, r=rank, n=name: f"rank {r} {n}: {m}")
    assert torch.equal(results[2]["after_init"]["1.running_mean"], torch.zeros(4))


def test_buffers_are_broadcast_from_rank_zero_before_each_forward():
    for result in _construction():
        assert torch.equal(result["running_mean_after_forward"], torch.full((4,), 10.0))


def test_module_and_state_dict_are_torchs():
    for result in _construction():
        assert result["is_module"]
        assert result["keys"][:2] == ["module.0.weight", "module.0.bias"]


def test_distributed_sampler_defaults_to_the_default_groups_world():
    assert [r["sampler"] for r in _construction()] == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]


def test_a_parameter_without_gradient_fails_the_next_iteration_naming_it():
    for rank, found in enumerate(_errors()):
        assert found["unused"] == (
            "RuntimeError: Expected to have finished reduction in the prior iteration before "
            "starting a new one. This error indicates that your module has parameters that were "
            "not used in producing loss. You can enable unused parameter detection by passing "
            "the keyword argument `find_unused_parameters=True` to "
            "`torch.nn.parallel.DistributedDataParallel`, and by \nmaking sure all `forward` "
            "function outputs participate in calculating loss. \nIf you already have done the "
            "above, then the distributed data parallel module wasn't able to locate the output "
            "tensors in the return value of your module's `forward` function. Please include "
            "the loss function and the structure of the return value of `forward` of your "
            "module when reporting this issue (e.g. list, dict, iterable).\n"
            f"Parameters which did not receive grad for rank {rank}: side.bias, side.weight\n"
            f"Parameter indices which did not receive grad for rank {rank}: 6 7")


def test_a_second_backward_after_the_reduction_accumulates_locally():
    assert all(found["second_backward"] == "no error" for found in _errors())


def test_a_gradient_ready_twice_in_one_iteration_is_an_error_naming_it():
    for found in _errors():
        assert re.fullmatch(r"RuntimeError: Expected to mark a variable ready only once\. .*"
                            r"Parameter at index 4 with name l3\.weight has been marked as ready "
                            r"twice\. .*", found["ready_twice"])


@pytest.mark.parametrize("key,message", [
    ("hook_twice", "RuntimeError: register_comm_hook or register_builtin_comm_hook can only be "
                   "called once."),
    ("hook_not_callable", "TypeError: Communication hook must be callable."),
    ("no_grad_params", "RuntimeError: DistributedDataParallel is not needed when a module "
                       "doesn't have any parameter that requires a gradient."),
    ("device_ids", "ValueError: DistributedDataParallel device_ids and output_device arguments "
                   "only work with single-device/multiple-device GPU modules or CPU modules, but "
                   "got device_ids [0], output_device None, and module parameters "
                   "{device(type='cpu')}."),
])
def test_bad_arguments_are_rejected_with_torchs_message(key, message):
    assert all(found[key] == message for found in _errors())


def test_different_models_on_different_ranks_are_rejected_naming_the_parameter():
    for found in _errors():
        assert found["mismatch"] == (
            "RuntimeError: DDP expects same model across all ranks, but Rank 1: 0-th param "
            "weight with shape [3, 2] and torch.float32 appears not to match the same param in "
            "process 0 (weight with shape [2, 2] and torch.float32).")

"""DDP communication hooks train exactly as torch's do (torch.distributed with gloo, same program).

tests/integration/_comm_hooks_ranks.py is written once against either package; each world
runs it under torch and under ringtorch, and the parameters after training must agree: to the
bit at world 2 for float32 (a sum of two numbers does not depend on order), to a few ulps of
the compressed dtype at world 3 (gloo and ringtorch add three numbers in different orders).
Where torch 2.13 cannot run a hook on CPU (both quantization hooks fail on gloo, the batched
PowerSGD hook fails its own assertion) the expected values come from torch's own quantize ops,
or from plain all-reduce where the compression is exact.
"""

from __future__ import annotations

import functools

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _comm_hooks_ranks as ranks

# name -> (case, tolerance at world 3)
CASES = {
    "allreduce_hook": (dict(hook="allreduce_hook"), 1e-6),
    "fp16_compress_hook": (dict(hook="fp16_compress_hook"), 5e-5),
    "bf16_compress_hook": (dict(hook="bf16_compress_hook"), 5e-4),
    "fp16_compress_wrapper": (dict(hook="fp16_compress_wrapper"), 5e-5),
    "bf16_compress_wrapper": (dict(hook="bf16_compress_wrapper"), 5e-4),
    "noop_hook": (dict(hook="noop_hook"), 0),
    "powerSGD-rank1": (dict(hook="powerSGD", steps=6, state=dict(
        matrix_approximation_rank=1, start_powerSGD_iter=2)), 1e-6),
    "powerSGD-rank2-no-feedback-cold": (dict(hook="powerSGD", steps=6, state=dict(
        matrix_approximation_rank=2, start_powerSGD_iter=3, use_error_feedback=False,
        warm_start=False)), 1e-6),
    "powerSGD-rank3-qr-batched-shapes": (dict(hook="powerSGD", steps=6, state=dict(
        matrix_approximation_rank=3, min_compression_rate=1, start_powerSGD_iter=2,
        batch_tensors_with_same_shape=True, random_seed=5)), 1e-6),
    "powerSGD-epsilon-seed": (dict(hook="powerSGD", steps=6, state=dict(
        matrix_approximation_rank=2, start_powerSGD_iter=2, orthogonalization_epsilon=1e-8,
        random_seed=123)), 1e-6),
    "powerSGD-in-fp16": (dict(hook="powerSGD", steps=6, wrap="fp16_compress_wrapper",
                              state=dict(matrix_approximation_rank=1, start_powerSGD_iter=2)),
                         1e-3),
    "powerSGD-before-start": (dict(hook="powerSGD", state=dict(start_powerSGD_iter=10)), 1e-6),
    **{f"register-{t}": (dict(register=t), 5e-5 if "16" in t else 1e-6)
       for t in ("ALLREDUCE", "FP16_COMPRESS", "POWER_SGD", "POWER_SGD_RANK2",
                 "BATCHED_POWER_SGD", "BATCHED_POWER_SGD_RANK2", "NOOP")},
}


@functools.cache
def _trained(world_size: int, package: str) -> dict[str, dict]:
    """Every case, trained in one world per (world size, package)."""
    names = list(CASES)
    per_rank = run_ranks(ranks.train_with_hook, world_size,
                         args=(package, [CASES[n][0] for n in names]), timeout=120)
    return {name: [r[i] for r in per_rank] for i, name in enumerate(names)}


def _assert_same_params(theirs: dict, ours: dict, atol: float, where: str) -> None:
    for key, value in theirs["params"].items():
        torch.testing.assert_close(ours["params"][key], value, atol=atol, rtol=0,
                                   msg=lambda m, k=key: f"{where} {k}: {m}")


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_hook_trains_to_torchs_parameters(case: str, world_size: int) -> None:
    theirs, ours = _trained(world_size, "torch")[case], _trained(world_size, "ringtorch")[case]
    atol = 0 if world_size == 2 else CASES[case][1]
    for rank in range(world_size):
        _assert_same_params(theirs[rank], ours[rank], atol, f"rank {rank}")


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith("powerSGD")])
def test_powersgd_counts_iterations_and_compression_as_torch(case: str) -> None:
    theirs, ours = _trained(2, "torch")[case][0], _trained(2, "ringtorch")[case][0]
    assert ours["iter"] == theirs["iter"]
    assert ours["stats"] == pytest.approx(theirs["stats"])


def test_registering_bf16_compress_trains_as_torchs_bf16_hook() -> None:
    # torch refuses DDPCommHookType.BF16_COMPRESS without NCCL; its hook runs under another name
    theirs = _trained(2, "torch")["bf16_compress_hook"]
    ours = run_ranks(ranks.train_with_hook, 2,
                     args=("ringtorch", [dict(register="BF16_COMPRESS")]), timeout=60)
    for rank in range(2):
        _assert_same_params(theirs[rank], ours[rank][0], 0, f"rank {rank}")


def test_powersgd_before_start_iter_is_plain_allreduce() -> None:
    theirs = _trained(2, "torch")["allreduce_hook"]
    ours = _trained(2, "ringtorch")["powerSGD-before-start"]
    for rank in range(2):
        _assert_same_params(theirs[rank], ours[rank], 0, f"rank {rank}")
    assert ours[0]["stats"] == (0, 0, 0)


MANY_BUCKETS = {
    "powerSGD-rank1": dict(hook="powerSGD", steps=6, bucket_cap_mb=0, state=dict(
        matrix_approximation_rank=1, start_powerSGD_iter=2)),
    "powerSGD-rank2-cold": dict(hook="powerSGD", steps=6, bucket_cap_mb=0, state=dict(
        matrix_approximation_rank=2, start_powerSGD_iter=2, warm_start=False)),
    "batched-powerSGD": dict(hook="batched", steps=6, bucket_cap_mb=0, state=dict(
        matrix_approximation_rank=1, start_powerSGD_iter=2)),
    "quantization-per-tensor": dict(hook="quantization_pertensor_hook", bucket_cap_mb=0),
    "quantization-per-channel": dict(hook="quantization_perchannel_hook", bucket_cap_mb=0),
}


def test_multi_step_hooks_leave_every_rank_the_same_model_with_a_bucket_per_parameter() -> None:
    # each bucket's collectives start in bucket order on every rank; started from callbacks
    # (as torch's hooks do) they race the next bucket's hook and ranks pair different ones
    per_rank = run_ranks(ranks.train_with_hook, 3, args=("ringtorch", list(MANY_BUCKETS.values())),
                         timeout=120)
    for i, name in enumerate(MANY_BUCKETS):
        for rank in range(1, 3):
            for key, value in per_rank[0][i]["params"].items():
                assert torch.equal(per_rank[rank][i]["params"][key], value), (name, rank, key)


def test_noop_hook_leaves_each_rank_its_own_model() -> None:
    ours = _trained(2, "ringtorch")["noop_hook"]
    assert not torch.equal(ours[0]["params"]["0.weight"], ours[1]["params"]["0.weight"])


def test_a_callback_may_wait_for_a_collective_it_starts_as_in_torch() -> None:
    theirs = run_ranks(ranks.chained_wait_in_callback, 2, args=("torch",), timeout=30)
    ours = run_ranks(ranks.chained_wait_in_callback, 2, args=("ringtorch",), timeout=30)
    for rank in range(2):
        torch.testing.assert_close(ours[rank], theirs[rank], atol=0, rtol=0)


def _dequantized_per_tensor(grad: torch.Tensor) -> torch.Tensor:
    observer = torch.ao.quantization.MinMaxObserver()
    observer(grad)
    scale, zero_point = observer.calculate_qparams()
    return torch.quantize_per_tensor(grad, float(scale), int(zero_point),
                                     torch.quint8).dequantize()


def _dequantized_per_channel(grad: torch.Tensor, row: int = 512) -> torch.Tensor:
    flat = grad.reshape(-1)
    rows = torch.nn.functional.pad(flat, (0, row - flat.numel() % row)).view(-1, row)
    observer = torch.ao.quantization.PerChannelMinMaxObserver()
    observer(rows)
    scales, zero_points = observer.calculate_qparams()
    dequantized = torch.quantize_per_channel(rows, scales, zero_points, 0,
                                             torch.quint8).dequantize()
    return dequantized.reshape(-1)[:flat.numel()].view_as(grad)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize(("hook", "dequantized"), [
    ("quantization_pertensor_hook", _dequantized_per_tensor),
    ("QUANTIZE_PER_TENSOR", _dequantized_per_tensor),
    ("quantization_perchannel_hook", _dequantized_per_channel),
    ("QUANTIZE_PER_CHANNEL", _dequantized_per_channel),
])
def test_quantization_hook_averages_torchs_quantized_gradients(hook, dequantized,
                                                               world_size) -> None:
    got = run_ranks(ranks.one_bucket_grads, world_size, args=("ringtorch", hook), timeout=60)
    expected = sum(dequantized(ranks.local_grads(r)) for r in range(world_size)) / world_size
    for rank in range(world_size):
        torch.testing.assert_close(got[rank], expected, atol=1e-6, rtol=0)


def test_powersgd_state_pickles_without_its_group_as_torchs() -> None:
    theirs = run_ranks(ranks.powersgd_state_pickle, 2, args=("torch",), timeout=60)[0]
    ours = run_ranks(ranks.powersgd_state_pickle, 2, args=("ringtorch",), timeout=60)[0]
    assert ours["keys"] == theirs["keys"]
    assert "process_group" not in ours["keys"]
    assert ours["group_is_world"] and theirs["group_is_world"]
    assert ours["iter"] == theirs["iter"] == 3
    assert ours["next_seed"] == theirs["next_seed"]
    assert ours["error_norms"] == pytest.approx(theirs["error_norms"], rel=1e-5)


def test_hook_given_a_group_this_rank_is_not_in_fails_naming_the_rank() -> None:
    got = run_ranks(ranks.hook_on_foreign_group, 3, timeout=60)
    assert got[:2] == ["trained", "trained"]
    assert got[2] == ("ValueError: The communication hook was given a process group that rank 2 "
                      "is not a member of (new_group returns GroupMember.NON_GROUP_MEMBER "
                      "outside the group); give each rank a group it belongs to")

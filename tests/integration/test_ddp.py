"""DistributedDataParallel on 1-4 ranks trains exactly as one process on the concatenated batches.

Every expected value is computed here, in the test process, with plain torch: one model, the
ranks' batches concatenated (or, where the ranks' forwards differ, the mean of their losses),
SGD. The ranks (tests/integration/_ddp_ranks.py) train with ringtorch's DDP and send back their
parameters; all ranks must agree with each other and with the reference to fp tolerance.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from ringtorch.testing import run_ranks
from tests.integration import _ddp_ranks as ranks


def _reference(data: list, side: bool | str = True) -> nn.Module:
    """One process: each micro-step's loss is the mean of the ranks' losses; grads accumulate."""
    model = ranks.make_net()
    for step in data:
        ranks.zero_grad(model.parameters())
        world = len(step)
        for micro in range(len(step[0])):
            losses = []
            for rank in range(world):
                x, y = step[rank][micro]
                use_side = side if isinstance(side, bool) else rank % 2 == 1
                losses.append(nn.functional.mse_loss(model(x, use_side=use_side), y))
            torch.stack(losses).mean().backward()
        ranks.sgd_step(model.parameters())
    return model


def _assert_matches(results: list[dict], reference: nn.Module, atol: float = 1e-6) -> None:
    expected = reference.state_dict()
    for rank, result in enumerate(results):
        for name, value in result["state"].items():
            torch.testing.assert_close(value, expected[name], atol=atol, rtol=1e-5,
                                       msg=lambda m, r=rank, n=name: f"rank {r} {n}: {m}")


CASES = {
    "default-buckets": dict(options={}),
    "bucket-per-parameter": dict(options={"bucket_cap_mb": 0}),
    "gradient-as-bucket-view": dict(options={"gradient_as_bucket_view": True, "bucket_cap_mb": 0}),
    "no-sync-accumulation": dict(options={}, accumulate=3),
    "no-sync-bucket-per-parameter": dict(options={"bucket_cap_mb": 0}, accumulate=2),
    "unused-everywhere": dict(options={"find_unused_parameters": True}, side=False),
    "unused-on-even-ranks": dict(options={"find_unused_parameters": True, "bucket_cap_mb": 0},
                                 side="odd"),
    "unused-with-bucket-view": dict(options={"find_unused_parameters": True,
                                             "gradient_as_bucket_view": True}, side="odd"),
    "static-graph-unused": dict(options={"static_graph": True}, side=False),
    "allreduce-hook": dict(options={"bucket_cap_mb": 0}, hook="allreduce_hook"),
}


COMPRESSION = {
    "fp16-compress-hook": (dict(options={}, hook="fp16_compress_hook"), 2e-3),
    "bf16-compress-hook": (dict(options={}, hook="bf16_compress_hook"), 2e-2),
}


@functools.cache
def _world(world_size: int) -> dict[str, tuple[list[dict], list]]:
    """Every case, run once per world size in a single world (start-up is the test budget)."""
    names = list(CASES) + (list(COMPRESSION) if world_size == 2 else [])
    cases = [CASES[n] if n in CASES else COMPRESSION[n][0] for n in names]
    per_rank = run_ranks(ranks.scenarios, world_size, args=(cases,), timeout=60)
    return {name: ([r[i] for r in per_rank],
                   ranks.make_data(world_size, micro=cases[i].get("accumulate", 1)))
            for i, name in enumerate(names)}


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_ddp_trains_as_one_process_on_the_concatenated_batches(case, world_size):
    per_rank, data = _world(world_size)[case]
    _assert_matches(per_rank, _reference(data, CASES[case].get("side", True)))


@pytest.mark.parametrize("case", list(COMPRESSION))
def test_compression_hooks_train_close_to_full_precision(case):
    per_rank, data = _world(2)[case]
    _assert_matches(per_rank, _reference(data), atol=COMPRESSION[case][1])


def test_gradient_as_bucket_view_leaves_grads_as_views_of_the_buckets():
    world = _world(2)
    assert all(all(r["grads_are_views"]) for r in world["gradient-as-bucket-view"][0])
    assert not any(any(r["grads_are_views"]) for r in world["default-buckets"][0])


def test_unused_parameters_keep_no_gradient_only_where_no_rank_used_them():
    world = _world(2)
    # parameters in order l1.w, l1.b, l2.w, l2.b, l3.w, l3.b, side.w, side.b
    for r in world["unused-everywhere"][0]:
        assert r["grad_none"] == [False] * 6 + [True] * 2
    for r in world["unused-on-even-ranks"][0]:
        assert r["grad_none"] == [False] * 8


def test_buckets_run_in_reverse_parameter_order():
    world = _world(2)
    assert world["bucket-per-parameter"][0][0]["buckets"] == [[7], [6], [5], [4], [3], [2], [1], [0]]
    assert world["default-buckets"][0][0]["buckets"] == [[7, 6, 5, 4, 3, 2, 1, 0]]


def test_buckets_of_several_parameters_or_views_live_in_the_groups_shared_memory():
    world = _world(2)
    for r in world["default-buckets"][0]:  # one bucket of 8 parameters
        assert r["in_shared_memory"] == [True]
    for r in world["bucket-per-parameter"][0]:  # each reduced in its own gradient instead
        assert r["in_shared_memory"] == [False] * 8
    for r in world["gradient-as-bucket-view"][0]:  # the gradients live in the buckets
        assert r["in_shared_memory"] == [True] * 8


def test_only_buckets_of_a_mebibyte_or_more_go_to_shared_memory_by_default():
    for found in run_ranks(ranks.shared_threshold, 2, timeout=60):
        assert found["buckets view=False"] == [[7, 6, 5, 4, 3], [2], [1, 0]]
        assert found["view=False"] == [False, False, False]  # l2.weight alone: in place
        assert found["view=True"] == [False, True, False]  # its 1 MiB bucket is shared


SHM_OFF_CASES = ["default-buckets", "gradient-as-bucket-view", "unused-with-bucket-view"]


def test_without_shared_memory_buckets_are_ordinary_tensors_and_train_the_same():
    cases = [CASES[name] for name in SHM_OFF_CASES]
    per_rank = run_ranks(ranks.scenarios, 2, args=(cases,), timeout=60,
                         env={"RINGTORCH_SHM": "0"})
    for i, name in enumerate(SHM_OFF_CASES):
        results = [r[i] for r in per_rank]
        assert not any(any(r["in_shared_memory"]) for r in results), name
        _assert_matches(results, _reference(ranks.make_data(2), CASES[name].get("side", True)))


def test_ddp_over_a_subgroup_starts_from_its_first_rank_and_averages_within_it():
    results = run_ranks(ranks.subgroup, 3, timeout=60)
    assert results[0] is None
    torch.manual_seed(1)
    model = ranks.Net()  # global rank 1 is the subgroup's rank 0: its weights win
    for result in results[1:]:
        for name, value in result["start"].items():
            torch.testing.assert_close(value, model.state_dict()[name])
    step = ranks.make_data(3)[0]
    loss = torch.stack([nn.functional.mse_loss(model(*step[r][0][:1]), step[r][0][1])
                        for r in (1, 2)]).mean()
    loss.backward()
    ranks.sgd_step(model.parameters())
    _assert_matches(results[1:], model)

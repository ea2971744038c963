"""Uneven inputs under Join: no rank hangs, and the result is the reference training's.

Rank r has `lengths[r]` batches. At step i the ranks that still have a batch take part; with
``divide_by_initial_world_size=True`` the gradient is their sum divided by the world size,
otherwise divided by the number of ranks still training. The reference below computes exactly
that in one process with plain torch. After the context every rank holds the last joiner's model.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ringtorch.testing import run_ranks
from tests.integration import _ddp_ranks as ranks


def _reference(lengths: list[int], divide_by_initial_world_size: bool) -> nn.Module:
    data = ranks.make_data(len(lengths), lengths=lengths)
    model = ranks.make_net()
    for step in range(max(lengths)):
        active = [r for r, n in enumerate(lengths) if step < n]
        divisor = len(lengths) if divide_by_initial_world_size else len(active)
        ranks.zero_grad(model.parameters())
        losses = [nn.functional.mse_loss(model(data[r][step][0]), data[r][step][1]) for r in active]
        (torch.stack(losses).sum() / divisor).backward()
        ranks.sgd_step(model.parameters())
    return model


@pytest.mark.parametrize("lengths,divide", [
    ([2, 4], True),
    ([3, 1, 2], False),
    ([1, 3, 2, 3], True),
])
def test_uneven_inputs_train_as_the_reference_and_end_with_one_model(lengths, divide):
    results = run_ranks(ranks.uneven, len(lengths), args=(lengths, divide), timeout=60)
    expected = _reference(lengths, divide).state_dict()
    for rank, result in enumerate(results):
        for name, value in result["state"].items():
            torch.testing.assert_close(value, expected[name], atol=1e-6, rtol=1e-5,
                                       msg=lambda m, r=rank, n=name: f"rank {r} {n}: {m}")


def test_throw_on_early_termination_raises_on_every_rank():
    messages = run_ranks(ranks.uneven_throw, 2, args=([1, 3],), timeout=60)
    assert messages == ["Rank 0 exhausted all inputs.",
                        "Detected at least one rank that exhausted inputs. Throwing across all ranks."]

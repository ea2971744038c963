"""torch's generic Join tutorial (uneven inputs), run under torch and ringtorch: same results.

Rank r has ``base + r`` inputs. Programs: tests/integration/_join_tutorial_ranks.py. The
counts are also computed here by hand: at input i every rank that still has one adds 1.
"""

from __future__ import annotations

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _join_tutorial_ranks as T


def _both(fn: object, world_size: int, base: int) -> tuple[list, list]:
    theirs = run_ranks(fn, world_size, args=("torch", base), timeout=120)
    ours = run_ranks(fn, world_size, args=("ringtorch", base), timeout=120)
    return theirs, ours


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_with_uneven_inputs_every_rank_exhausts_its_inputs_as_under_torch(world_size: int
                                                                               ) -> None:
    theirs, ours = _both(T.ddp_only, world_size, 5)
    for rank in range(world_size):
        assert ours[rank]["seen"] == theirs[rank]["seen"] == 5 + rank
        for a, b in zip(theirs[rank]["grad"], ours[rank]["grad"], strict=True):
            torch.testing.assert_close(b, a, msg=lambda m, r=rank: f"rank {r}: {m}")


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_and_zero_with_uneven_inputs_end_with_torchs_parameters(world_size: int) -> None:
    theirs, ours = _both(T.ddp_and_zero, world_size, 4)
    for rank in range(world_size):
        assert ours[rank]["seen"] == theirs[rank]["seen"] == 4 + rank
        for a, b in zip(theirs[rank]["params"], ours[rank]["params"], strict=True):
            torch.testing.assert_close(b, a, msg=lambda m, r=rank: f"rank {r}: {m}")


@pytest.mark.parametrize("world_size", [2, 4])
def test_user_written_joinable_counts_as_under_torch(world_size: int) -> None:
    base = 3
    theirs, ours = _both(T.counter, world_size, base)
    lengths = [base + r for r in range(world_size)]
    expected = [sum(sum(1 for n in lengths if i < n) for i in range(length))
                for length in lengths]
    assert [o["count"] for o in ours] == [t["count"] for t in theirs] == expected
    assert [o["max_count"] for o in ours] == [t["max_count"] for t in theirs] == (
        [max(expected)] * world_size)

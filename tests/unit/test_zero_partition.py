"""ZeroRedundancyOptimizer's partition (``partition_greedy``), case by case, computed by hand.

torch's rule: within each param group, largest parameter first (ties keep their order), each to
the rank with the fewest elements so far (the lowest rank on ties); the running sizes carry over
from one group to the next. tests/integration/test_zero.py checks the same against torch's own
ZeroRedundancyOptimizer in real processes.
"""

from __future__ import annotations

import pytest
import torch

from ringtorch.distributed.optim.zero_redundancy_optimizer import partition_greedy

CASES = {
    # name: (numels per group, world size, expected: indices (into the flat list) per rank, group)
    "largest-first": ([[2, 4, 3, 3]], 2, [[[1, 0]], [[2, 3]]]),
    "ties-go-to-the-lowest-rank": ([[5, 5, 5]], 3, [[[0]], [[1]], [[2]]]),
    "equal-sizes-keep-their-order": ([[1, 1, 1, 1]], 2, [[[0, 2]], [[1, 3]]]),
    "sizes-carry-over-groups": ([[6], [2, 2, 2, 2]], 2, [[[0], [4]], [[], [1, 2, 3]]]),
    "more-ranks-than-params": ([[3]], 3, [[[0]], [[]], [[]]]),
    "one-rank": ([[1, 2], [3]], 1, [[[1, 0], [2]]]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_partition_greedy(case: str) -> None:
    numels, world_size, expected = CASES[case]
    flat = [torch.zeros(n) for group in numels for n in group]
    groups, start = [], 0
    for group in numels:
        groups.append(flat[start:start + len(group)])
        start += len(group)
    index = {id(t): i for i, t in enumerate(flat)}
    got = [[[index[id(t)] for t in group] for group in per_rank]
           for per_rank in partition_greedy(groups, world_size)]
    assert got == expected

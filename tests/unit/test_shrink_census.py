"""When the shrink agreement's census may close, and whom it names (census_outcome, pure)."""

from __future__ import annotations

import pytest

from ringtorch.collectives.shrink_agree import census_outcome

CASES = [
    # size, excluded, posted, dead, wait_over -> survivors (None: keep waiting)
    (4, {3}, {0: [3], 1: [3]}, set(), False, None),  # rank 2 alive and silent: wait
    (4, {3}, {0: [3], 1: [3]}, {2}, False, [0, 1]),  # rank 2 known dead: close at once
    (4, {3}, {0: [3], 1: [3]}, set(), True, [0, 1]),  # the wait ran out: left out
    (4, {3}, {0: [3], 1: [3], 2: [3]}, set(), False, [0, 1, 2]),
    (4, set(), {0: [], 1: [2], 3: []}, set(), False, [0, 1, 3]),  # one survivor excludes 2
    (3, {2}, {0: [2], 2: []}, set(), False, None),  # rank 1 is waited for
    (3, {2}, {0: [2], 1: [2], 2: []}, set(), False, [0, 1]),  # an excluded rank that posts
]


@pytest.mark.parametrize(("size", "excluded", "posted", "dead", "wait_over", "expected"), CASES)
def test_census_closes_when_every_member_is_posted_excluded_or_dead(
        size: int, excluded: set[int], posted: dict[int, list[int]], dead: set[int],
        wait_over: bool, expected: list[int] | None) -> None:
    assert census_outcome(size, excluded, posted, dead, wait_over) == expected

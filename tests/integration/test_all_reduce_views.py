"""An all_reduce of a buffer it has seen before: the native backend keeps its view of a
buffer's bytes per (address, size), so each call must still reduce exactly the tensor it is
given, and still refuse a tensor whose memory does not hold its values.

One world of 2 (shared memory) runs every step; expected values come from NumPy.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ringtorch.testing import run_ranks
from tests.integration import _all_reduce_views_ranks as R

WS = 2


@functools.cache
def results() -> list[dict]:
    return run_ranks(R.views, WS, timeout=90)


def _total() -> np.ndarray:
    return np.sum([R.start(r) for r in range(WS)], axis=0)


@pytest.mark.parametrize("rank", range(WS))
def test_a_buffer_reduced_again_and_again_gets_each_calls_sum(rank: int) -> None:
    got, want = results()[rank], _total()
    for step in range(3):
        np.testing.assert_array_equal(got[f"again {step}"], want)
        want = want * WS


@pytest.mark.parametrize("rank", range(WS))
def test_a_shorter_tensor_at_the_same_address_reduces_only_its_own_elements(rank: int) -> None:
    want = _total() * WS ** 2
    want[: R.N // 2] *= WS
    np.testing.assert_array_equal(results()[rank]["shorter"], want)


@pytest.mark.parametrize("rank", range(WS))
def test_a_negated_view_of_a_known_buffer_is_refused_and_the_group_goes_on(rank: int) -> None:
    got = results()[rank]
    assert got["negated"] is not None and "conjugate or negative bit set" in got["negated"]
    np.testing.assert_array_equal(got["after"], got["shorter"] * WS)

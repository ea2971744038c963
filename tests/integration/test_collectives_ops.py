"""What the collectives facade does above any backend, at world sizes 1 to 4: NumPy arrays
and non-contiguous tensors in and out, the coalesced form, an async barrier's Work, sequence
numbers, and which transport a same-host group uses.

Every collective x dtype x reduction against NumPy is the conformance suite's
(tests/conformance/test_backend.py, on every backend configuration). One world per size runs
every case here (tests/integration/_collectives_ranks.py); the tests rebuild every rank's
inputs and compute the expected results with NumPy, never with ringtorch.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ringtorch.testing import run_ranks
from tests.integration import _collectives_ranks as R

# (world size, fast path): shared memory on and off both run at a world above 1
WORLDS = [(1, "shm"), (2, "shm"), (3, "sockets"), (4, "shm")]


@functools.cache
def results(ws: int, fast_path: str) -> list[dict]:
    env = {"RINGTORCH_SHM": "1" if fast_path == "shm" else "0"}
    return run_ranks(R.run_extras, ws, timeout=90, env=env)


def _grid(rank: int, salt: int) -> np.ndarray:
    return R.values(rank, 12, salt).astype(np.float32).reshape(3, 4).T


@pytest.mark.parametrize(("ws", "fast_path"), WORLDS)
def test_the_group_uses_shared_memory_exactly_when_the_fast_path_is_on(
        ws: int, fast_path: str) -> None:
    for rank, res in enumerate(results(ws, fast_path)):
        assert res["uses_shm"] is (fast_path == "shm" and ws > 1), f"rank {rank}"


@pytest.mark.parametrize(("ws", "fast_path"), WORLDS)
def test_numpy_arrays_are_accepted_and_receive_the_results(ws: int, fast_path: str) -> None:
    total = np.sum([R.values(r, 6, 1) for r in range(ws)], axis=0)
    for rank, res in enumerate(results(ws, fast_path)):
        assert isinstance(res["numpy/all_reduce"], np.ndarray)
        np.testing.assert_array_equal(res["numpy/all_reduce"], total, err_msg=f"rank {rank}")
        assert res["numpy/broadcast"].dtype == np.int32
        np.testing.assert_array_equal(res["numpy/broadcast"], R.values(0, 6, 3).astype(np.int32))
        for r in range(ws):
            np.testing.assert_array_equal(res["numpy/all_gather"][r],
                                          R.values(r, 6, 4).astype(np.float32))


@pytest.mark.parametrize(("ws", "fast_path"), WORLDS)
def test_non_contiguous_tensors_work_as_in_torch(ws: int, fast_path: str) -> None:
    for rank, res in enumerate(results(ws, fast_path)):
        np.testing.assert_array_equal(res["noncontig/all_reduce"].numpy(),
                                      sum(_grid(r, 50) for r in range(ws)), err_msg=f"rank {rank}")
        np.testing.assert_array_equal(res["noncontig/broadcast"].numpy(), _grid(0, 51))
        for r in range(ws):
            np.testing.assert_array_equal(res["noncontig/all_gather"][r].numpy(), _grid(r, 52))
        np.testing.assert_array_equal(res["noncontig/scatter"].numpy(), _grid(rank, 56))
    root = results(ws, fast_path)[0]
    np.testing.assert_array_equal(root["noncontig/reduce"].numpy(),
                                  sum(_grid(r, 54) for r in range(ws)))
    for r in range(ws):
        np.testing.assert_array_equal(root["noncontig/gather"][r].numpy(), _grid(r, 55))


@pytest.mark.parametrize(("ws", "fast_path"), WORLDS)
def test_coalesced_all_reduce_reduces_every_tensor_of_the_list(ws: int, fast_path: str) -> None:
    for res in results(ws, fast_path):
        for i, (n, salt) in enumerate([(3, 60), (5, 61)]):
            expected = np.sum([R.values(r, n, salt) for r in range(ws)], axis=0)
            np.testing.assert_array_equal(res["all_reduce_coalesced"][i].numpy(), expected)


@pytest.mark.parametrize(("ws", "fast_path"), WORLDS)
def test_an_async_barrier_completes_successfully_with_no_result(ws: int, fast_path: str) -> None:
    for res in results(ws, fast_path):
        assert res["async/barrier"] == (True, True, None, [])


@pytest.mark.parametrize(("ws", "fast_path"), WORLDS)
def test_sequence_numbers_count_the_collectives_identically_on_every_rank(
        ws: int, fast_path: str) -> None:
    # 3 on NumPy arrays, 6 non-contiguous, 1 coalesced, the async and the monitored barrier
    assert {res["seq"] for res in results(ws, fast_path)} == {12}

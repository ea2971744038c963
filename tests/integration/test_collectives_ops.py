"""Every collective x world sizes 1-4 x ten dtypes, against NumPy, with the same-host fast
path on (shared memory) and off (RINGTORCH_SHM=0: Unix sockets).

One world per size and fast-path setting runs every case (tests/integration/_collectives_ranks.py)
and sends back what each rank got; the tests here rebuild every rank's inputs (a pure function
of rank, dtype and salt) and compute the expected result with NumPy, never with ringtorch.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _collectives_ranks as R

WORLDS = [1, 2, 3, 4]


_FAST_PATH = {"RINGTORCH_SHM": "1"}  # what the running test's ``fast_path`` parameter set


@pytest.fixture(autouse=True, params=["shm", "sockets"])
def fast_path(request: pytest.FixtureRequest) -> str:
    """Every test runs twice: shared memory on, and off."""
    _FAST_PATH["RINGTORCH_SHM"] = "1" if request.param == "shm" else "0"
    return request.param


@functools.cache
def _results(ws: int, shm: str) -> list[dict]:
    return run_ranks(R.run_all_ops, ws, timeout=90, env={"RINGTORCH_SHM": shm})


def results(ws: int) -> list[dict]:
    return _results(ws, _FAST_PATH["RINGTORCH_SHM"])


@pytest.mark.parametrize("ws", WORLDS)
def test_the_group_uses_shared_memory_exactly_when_the_fast_path_is_on(
        ws: int, fast_path: str) -> None:
    for rank, res in enumerate(results(ws)):
        assert res["uses_shm"] is (fast_path == "shm" and ws > 1), f"rank {rank}"


def _np(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.numpy()


def _stack(ws: int, dtype: str, salt: int, n: int = R.N) -> np.ndarray:
    return np.stack([_np(R.make(r, dtype, n, salt=salt)) for r in range(ws)]).astype(
        np.float64 if dtype in ("float16", "bfloat16") else _np(R.make(0, dtype)).dtype)


def _reduce(stack: np.ndarray, op: str, dtype: str) -> np.ndarray:
    if dtype == "bool":
        kinds = {"SUM": np.logical_or, "MAX": np.logical_or, "BOR": np.logical_or,
                 "PRODUCT": np.logical_and, "MIN": np.logical_and, "BAND": np.logical_and,
                 "BXOR": np.logical_xor}
        return kinds[op].reduce(stack, axis=0)
    if op == "AVG":
        return stack.mean(axis=0)
    ufunc = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
             "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op]
    return ufunc.reduce(stack, axis=0, dtype=stack.dtype)


def _assert_equal(got: torch.Tensor, expected: np.ndarray, dtype: str, what: str,
                  op: str = "SUM") -> None:
    want = torch.from_numpy(np.asarray(expected)).to(R.DTYPES[dtype])
    assert got.dtype == R.DTYPES[dtype], what
    if op == "AVG":
        tol = {"float64": 1e-12, "float32": 1e-6, "float16": 1e-3, "bfloat16": 1e-2}
        torch.testing.assert_close(got, want, atol=tol.get(dtype, 1e-6), rtol=0, msg=what)
    else:
        assert torch.equal(got, want), f"{what}: got {got}, expected {want}"


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("dtype", list(R.DTYPES))
def test_all_reduce_every_op_matches_numpy(ws: int, dtype: str) -> None:
    for op in R.reduce_ops(dtype):
        expected = _reduce(_stack(ws, dtype, 1), op, dtype)
        for rank, res in enumerate(results(ws)):
            _assert_equal(res[f"all_reduce/{op}/{dtype}"], expected, dtype,
                          f"all_reduce {op} rank {rank}", op)


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("dtype", list(R.DTYPES))
def test_reduce_gives_dst_the_reduction(ws: int, dtype: str) -> None:
    for op in R.reduce_ops(dtype):
        expected = _reduce(_stack(ws, dtype, 2), op, dtype)
        _assert_equal(results(ws)[ws // 2][f"reduce/{op}/{dtype}"], expected, dtype,
                      f"reduce {op}", op)


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("dtype", list(R.DTYPES))
def test_reduce_scatter_both_forms_give_rank_i_the_sum_of_part_i(ws: int, dtype: str) -> None:
    for rank, res in enumerate(results(ws)):
        expected = _reduce(_stack(ws, dtype, 10 + rank), "SUM", dtype)
        _assert_equal(res[f"reduce_scatter/{dtype}"], expected, dtype, f"rank {rank}")
        _assert_equal(res[f"reduce_scatter_single/{dtype}"], expected, dtype, f"rank {rank}")
        assert res[f"reduce_scatter_single_input_kept/{dtype}"], "the input was modified"


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("dtype", list(R.DTYPES))
def test_broadcast_copies_src_everywhere(ws: int, dtype: str) -> None:
    for rank, res in enumerate(results(ws)):
        _assert_equal(res[f"broadcast/{dtype}"], _np(R.make(ws - 1, dtype, salt=3)), dtype,
                      f"rank {rank}")


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("dtype", list(R.DTYPES))
def test_all_gather_forms_give_every_rank_every_input(ws: int, dtype: str) -> None:
    inputs = [_np(R.make(r, dtype, salt=4)) for r in range(ws)]
    for rank, res in enumerate(results(ws)):
        for r in range(ws):
            _assert_equal(res[f"all_gather/{dtype}"][r], inputs[r], dtype, f"rank {rank}")
        _assert_equal(res[f"all_gather_single/{dtype}"], np.concatenate(inputs), dtype,
                      f"rank {rank}")
        _assert_equal(res[f"all_gather_single_stacked/{dtype}"], np.stack(inputs), dtype,
                      f"rank {rank}")


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("dtype", list(R.DTYPES))
def test_gather_and_scatter(ws: int, dtype: str) -> None:
    gathered = results(ws)[0][f"gather/{dtype}"]
    for r in range(ws):
        _assert_equal(gathered[r], _np(R.make(r, dtype, salt=5)), dtype, f"gather part {r}")
    for rank, res in enumerate(results(ws)):
        _assert_equal(res[f"scatter/{dtype}"], _np(R.make(ws - 1, dtype, salt=20 + rank)),
                      dtype, f"scatter rank {rank}")


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("dtype", list(R.DTYPES))
def test_all_to_all_forms(ws: int, dtype: str) -> None:
    for rank, res in enumerate(results(ws)):
        expected = [_np(R.make(j, dtype, salt=30 + rank)) for j in range(ws)]
        for j in range(ws):
            _assert_equal(res[f"all_to_all/{dtype}"][j], expected[j], dtype, f"rank {rank}")
        _assert_equal(res[f"all_to_all_single/{dtype}"], np.concatenate(expected), dtype,
                      f"rank {rank}")
        parts = [_np(R.make(j, dtype, 2 * R.split_sizes(ws, j)[rank], salt=40 + rank))
                 for j in range(ws)]
        _assert_equal(res[f"all_to_all_single_splits/{dtype}"],
                      np.concatenate(parts).reshape(-1, 2), dtype, f"rank {rank}")


@pytest.mark.parametrize("ws", WORLDS)
def test_numpy_arrays_are_accepted_and_receive_the_results(ws: int) -> None:
    total = _stack(ws, "float64", 1).sum(axis=0)
    for rank, res in enumerate(results(ws)):
        assert isinstance(res["numpy/all_reduce"], np.ndarray)
        np.testing.assert_array_equal(res["numpy/all_reduce"], total, err_msg=f"rank {rank}")
        np.testing.assert_array_equal(res["numpy/broadcast"], _np(R.make(0, "int32", salt=3)))
        for r in range(ws):
            np.testing.assert_array_equal(res["numpy/all_gather"][r],
                                          _np(R.make(r, "float32", salt=4)))


@pytest.mark.parametrize("ws", WORLDS)
def test_non_contiguous_tensors_work_as_in_torch(ws: int) -> None:
    total = sum(_np(R.make(r, "float32", 12, salt=50)).reshape(3, 4).T for r in range(ws))
    for res in results(ws):
        np.testing.assert_array_equal(_np(res["noncontig/all_reduce"]), total)
        np.testing.assert_array_equal(_np(res["noncontig/broadcast"]),
                                      _np(R.make(0, "float32", 12, salt=51)).reshape(3, 4).T)
        for r in range(ws):
            np.testing.assert_array_equal(_np(res["noncontig/all_gather"][r]),
                                          _np(R.make(r, "float32", 12, salt=52)).reshape(3, 4).T)


@pytest.mark.parametrize("ws", WORLDS)
def test_non_contiguous_reduce_gather_and_scatter(ws: int) -> None:
    def grid(r: int, salt: int) -> np.ndarray:
        return _np(R.make(r, "float32", 12, salt=salt)).reshape(3, 4).T

    root = results(ws)[0]
    np.testing.assert_array_equal(_np(root["noncontig/reduce"]),
                                  sum(grid(r, 54) for r in range(ws)))
    for r in range(ws):
        np.testing.assert_array_equal(_np(root["noncontig/gather"][r]), grid(r, 55))
    for rank, res in enumerate(results(ws)):
        np.testing.assert_array_equal(_np(res["noncontig/scatter"]), grid(rank, 56))


@pytest.mark.parametrize("ws", WORLDS)
def test_all_gather_takes_parts_of_different_sizes(ws: int) -> None:
    for res in results(ws):
        for r in range(ws):
            np.testing.assert_array_equal(_np(res["uneven/all_gather"][r]),
                                          _np(R.make(r, "int64", r + 1, salt=53)))


@pytest.mark.parametrize("ws", WORLDS)
def test_coalesced_all_reduce_and_premul_sum(ws: int) -> None:
    for res in results(ws):
        for i, (n, salt) in enumerate([(3, 60), (5, 61)]):
            expected = _stack(ws, "float32", salt, n).sum(axis=0)
            np.testing.assert_array_equal(_np(res["all_reduce_coalesced"][i]), expected)
        np.testing.assert_array_equal(_np(res["premul_sum"]),
                                      2.0 * _stack(ws, "float32", 62).sum(axis=0))


@pytest.mark.parametrize("ws", WORLDS)
def test_all_reduce_is_bitwise_identical_on_every_rank(ws: int) -> None:
    blobs = {res["bits/all_reduce"] for res in results(ws)}
    assert len(blobs) == 1
    got = np.frombuffer(next(iter(blobs)), dtype=np.float32)
    data = [np.random.default_rng(r).standard_normal(4099).astype(np.float32) for r in range(ws)]
    np.testing.assert_allclose(got, np.sum(data, axis=0, dtype=np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("ws", WORLDS)
def test_async_works_complete_in_issue_order_with_their_results(ws: int) -> None:
    for res in results(ws):
        assert res["async/values"] == [[float(sum(r + i for r in range(ws)))] * 2
                                       for i in range(8)]
        assert res["async/completed_after_last"] == [True] * 8
        assert res["async/future"] == [float(sum(range(ws)))] * 2
        assert res["async/barrier"] == (True, True, None, [])


@pytest.mark.parametrize("ws", WORLDS)
def test_sequence_numbers_count_the_collectives_identically_on_every_rank(ws: int) -> None:
    seqs = {res["seq"] for res in results(ws)}
    assert len(seqs) == 1 and seqs.pop() > 100
    for res in results(ws):
        assert res["monitored_barrier_s"] < 20

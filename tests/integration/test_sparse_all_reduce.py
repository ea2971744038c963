"""all_reduce of a sparse COO tensor sums it across ranks, as torch's gloo does: the result,
written into the caller's tensor, is coalesced, with the same indices and values as gloo's;
only SUM is allowed, and the other collectives refuse sparse tensors with torch's error.

Worlds of 2 and 3 run the same rank code under ringtorch and under torch's gloo; the tests
compare ringtorch's results and errors with gloo's, and the values with NumPy's dense sums.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ringtorch.testing import run_ranks
from tests.integration import _sparse_ranks as R

WORLDS = [2, 3]


@functools.cache
def results(library: str, ws: int) -> list[dict]:
    return run_ranks(R.sparse, ws, args=(library,), timeout=90)


def ours(ws: int) -> list[dict]:
    return results("ringtorch.distributed", ws)


def torchs(ws: int) -> list[dict]:
    return results("torch.distributed", ws)


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("case", R.CASES)
def test_the_result_is_gloo_s_coalesced_sum_in_the_caller_s_tensor(ws: int, case: str) -> None:
    dense = np.sum([R.inputs(r, case).to_dense().numpy() for r in range(ws)], axis=0)
    for rank in range(ws):
        returned, state = ours(ws)[rank][case]
        assert returned is None
        assert state == torchs(ws)[rank][case][1], f"rank {rank}"
        is_sparse, coalesced, shape, _, indices, values = state
        assert is_sparse and coalesced and shape == dense.shape
        rebuilt = np.zeros(shape, dtype=dense.dtype)
        rebuilt[tuple(np.array(indices, dtype=np.int64).reshape(len(indices), -1))] = values
        np.testing.assert_array_equal(rebuilt, dense, err_msg=f"rank {rank}")


@pytest.mark.parametrize("ws", WORLDS)
def test_an_asynchronous_sparse_all_reduce_gives_a_work_that_completes_with_the_sum(
        ws: int) -> None:
    for rank in range(ws):
        assert ours(ws)[rank]["async"] == torchs(ws)[rank]["async"]
        assert ours(ws)[rank]["async"][1] == ours(ws)[rank]["matrix"][1]


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("op", ["MAX", "MIN", "PRODUCT", "AVG"])
def test_only_sum_reduces_sparse_tensors(ws: int, op: str) -> None:
    expected = ("RuntimeError", "ProcessGroupGloo::allreduce: unsupported reduction operation "
                                "(allreduce of sparse tensors only works with ReduceOp.SUM)")
    for rank in range(ws):
        assert torchs(ws)[rank][f"op {op}"] == expected
        assert ours(ws)[rank][f"op {op}"] == expected


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("case", ["shapes differ", "sparse dims differ"])
def test_every_rank_refuses_tensors_of_different_shapes(ws: int, case: str) -> None:
    for rank in range(ws):
        assert torchs(ws)[rank][case] == ("RuntimeError", "Sparse dimensions do not match")
        assert ours(ws)[rank][case] == ("RuntimeError", "Sparse dimensions do not match")


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize(("case", "operator"), [("broadcast", "broadcast_"),
                                                ("all_gather", "allgather_")])
def test_other_collectives_refuse_a_sparse_tensor_with_torch_s_error(
        ws: int, case: str, operator: str) -> None:
    head = f"Could not run 'c10d::{operator}' with arguments from the 'SparseCPU' backend."
    for rank in range(ws):
        for library in (torchs, ours):
            kind, message = library(ws)[rank][case]
            assert kind == "NotImplementedError" and message.startswith(head), message


@pytest.mark.parametrize("ws", WORLDS)
def test_the_group_works_on_after_the_errors(ws: int) -> None:
    for rank in range(ws):
        assert ours(ws)[rank]["after"] == ours(ws)[rank]["matrix"][1]

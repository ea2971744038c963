"""Collectives take tensors that require grad, as torch's do: a model's parameters are
reduced, broadcast, gathered, sent and received in place, and autograd records nothing.

One world of 2 runs every operation on fresh ``nn.Parameter``s under ringtorch, and one the
same calls under torch's gloo (which accepts them all); expected values come from NumPy.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ringtorch.testing import run_ranks
from tests.integration import _requires_grad_ranks as R

WS = 2
LIBRARIES = ["ringtorch.distributed", "torch.distributed"]


@functools.cache
def results(library: str) -> list[dict]:
    return run_ranks(R.on_parameters, WS, args=(library,), timeout=90)


def _expected(op: str, rank: int) -> np.ndarray | None:
    """What the parameter holds afterwards; None where torch leaves it unspecified (a
    reduce's input on the other ranks: gloo uses it as scratch)."""
    mine, total = R.start(rank, WS), np.sum([R.start(r, WS) for r in range(WS)], axis=0)
    return {
        "all_reduce": total, "all_reduce_strided_view": total, "broadcast": R.start(0, WS),
        "all_gather": mine, "send_recv": R.start(0, WS), "isend_irecv": R.start(0, WS),
        "reduce": total if rank == 0 else None, "scatter": R.start(rank, WS),
        "all_reduce_coalesced": total, "all_reduce_avg": total / WS,
    }[op]


OPS = ["all_reduce", "all_reduce_strided_view", "broadcast", "all_gather", "send_recv",
       "isend_irecv", "reduce", "scatter"]


@pytest.mark.parametrize("library", LIBRARIES)
@pytest.mark.parametrize("op", OPS)
def test_an_operation_on_parameters_writes_in_place_and_they_still_require_grad(
        library: str, op: str) -> None:
    for rank, res in enumerate(results(library)):
        state, expected = res[op], _expected(op, rank)
        if expected is not None:
            np.testing.assert_array_equal(state["values"], expected,
                                          err_msg=f"{op} on rank {rank}")
        assert state["requires_grad"], f"{op} on rank {rank}"
        assert not state["grad_fn"] and not state["grad"], f"{op} on rank {rank}: autograd"


@pytest.mark.parametrize("op", ["all_reduce_avg", "all_reduce_coalesced"])
def test_ringtorch_also_averages_and_coalesces_parameters_in_place(op: str) -> None:
    for rank, res in enumerate(results("ringtorch.distributed")):
        state = res[op]
        np.testing.assert_array_equal(state["values"], _expected(op, rank), err_msg=op)
        assert state["requires_grad"] and not state["grad_fn"] and not state["grad"]


@pytest.mark.parametrize("library", LIBRARIES)
def test_all_gather_of_a_parameter_gathers_every_rank_s_values(library: str) -> None:
    for rank, res in enumerate(results(library)):
        for r in range(WS):
            np.testing.assert_array_equal(res["all_gather"]["parts"][r], R.start(r, WS),
                                          err_msg=f"rank {rank}, part {r}")

"""Collectives and point-to-point operations on device tensors, staged through pinned host
memory in the order of the caller's current stream (ringtorch/distributed/_device_staging.py).

One set of test bodies over two runtimes: ``sim`` (the simulated device, worlds 1-4, in the
default suite) and ``cuda`` (marked gpu(1): worlds 1-2, every rank on GPU 0; run by the GPU
check). The feature is opened with RINGTORCH_DEVICE_UNCONFIRMED=1 as the GPU check does; each
world also runs the closed case (today's behaviour). One world per (runtime, size) runs every
case (tests/integration/_device_staging_ranks.py); expected values come from NumPy over
inputs the test rebuilds itself.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from ringtorch.testing import run_ranks
from tests.integration import _device_staging_ranks as R

WORLDS = [("sim", 1), ("sim", 2), ("sim", 3), ("sim", 4),
          pytest.param("cuda", 1, marks=pytest.mark.gpu(1)),
          pytest.param("cuda", 2, marks=pytest.mark.gpu(1))]
MULTI = [w for w in WORLDS if (w.values if hasattr(w, "values") else w)[1] > 1]
# the ordering cases (streams kept busy for a while) run in worlds 1 and 2 only
SMALL = [w for w in WORLDS if (w.values if hasattr(w, "values") else w)[1] <= 2]
PAIRS = [w for w in WORLDS if (w.values if hasattr(w, "values") else w)[1] == 2]
MODES = ["sync", "async"]
N = 6


@functools.cache
def results(runtime: str, ws: int) -> list[dict]:
    env = {"RINGTORCH_DEVICE_RUNTIME": runtime, "RINGTORCH_DEVICE_UNCONFIRMED": "1"}
    return run_ranks(R.run, ws, timeout=120, env=env)


def _sum(ws: int, n: int, salt: int) -> np.ndarray:
    return np.sum([R.values(r, n, salt) for r in range(ws)], axis=0)


def _eq(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    np.testing.assert_array_equal(got, expected, err_msg=what)


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_every_rank_ran_on_the_runtime_asked_for(runtime: str, ws: int) -> None:
    assert [res["runtime"] for res in results(runtime, ws)] == [runtime] * ws


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_all_reduce_broadcast_and_reduce_on_device_tensors(runtime: str, ws: int,
                                                           mode: str) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        _eq(res[f"{mode}/all_reduce"], _sum(ws, N, 1), f"all_reduce rank {rank}")
        _eq(res[f"{mode}/broadcast"], R.values(ws - 1, N, 2), f"broadcast rank {rank}")
        if rank == 0:
            _eq(res[f"{mode}/reduce"], _sum(ws, N, 3), "reduce on dst")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_gathers_and_scatters_on_device_tensors(runtime: str, ws: int, mode: str) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        for r in range(ws):
            _eq(res[f"{mode}/all_gather"][r], R.values(r, N, 4), f"all_gather rank {rank}")
        _eq(res[f"{mode}/all_gather_into_tensor"],
            np.concatenate([R.values(r, N, 5) for r in range(ws)]), f"into_tensor rank {rank}")
        if rank == 0:
            for r in range(ws):
                _eq(res[f"{mode}/gather"][r], R.values(r, N, 6), f"gather part {r}")
        else:
            assert res[f"{mode}/gather"] is None
        _eq(res[f"{mode}/scatter"], R.values(rank, N, 7), f"scatter rank {rank}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_reduce_scatters_and_all_to_alls_on_device_tensors(runtime: str, ws: int,
                                                           mode: str) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        _eq(res[f"{mode}/reduce_scatter"], _sum(ws, N, 8 + rank), f"reduce_scatter {rank}")
        _eq(res[f"{mode}/reduce_scatter_tensor"], _sum(ws, N * ws, 20)[rank * N:(rank + 1) * N],
            f"reduce_scatter_tensor rank {rank}")
        for r in range(ws):
            _eq(res[f"{mode}/all_to_all"][r], R.values(r, N, 30 + rank), f"all_to_all {rank}")
        _eq(res[f"{mode}/all_to_all_single"],
            np.concatenate([R.values(r, N * ws, 40)[rank * N:(rank + 1) * N] for r in range(ws)]),
            f"all_to_all_single rank {rank}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("runtime", "ws"), MULTI)
def test_send_recv_and_batches_on_device_tensors(runtime: str, ws: int, mode: str) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        prv = (rank - 1) % ws
        _eq(res[f"{mode}/send_recv"], R.values(prv, N, 50), f"send/recv rank {rank}")
        _eq(res["batch_isend_irecv"], R.values(prv, 5, 70), f"batch rank {rank}")
        assert res["sync/recv_returns"] == prv


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_coalesced_forms_on_device_tensors(runtime: str, ws: int) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        for key, salts in (("coalesced/all_reduce", (60, 61)),
                           ("coalesced/all_reduce_async", (62, 63))):
            _eq(res[key][0], _sum(ws, 4, salts[0]), f"{key} rank {rank}")
            _eq(res[key][1], _sum(ws, 3, salts[1]), f"{key} rank {rank}")
        for r in range(ws):
            for i, (n, salt) in enumerate(((2, 64), (3, 65))):
                _eq(res["coalesced/all_gather"][r][i], R.values(r, n, salt),
                    f"all_gather_coalesced rank {rank}")


@pytest.mark.parametrize(("runtime", "ws"), SMALL)
def test_work_queued_on_the_current_stream_before_the_call_is_included(runtime: str,
                                                                        ws: int) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        _eq(res["order/queued_work_included"], _sum(ws, 4, 80), f"rank {rank}")


@pytest.mark.parametrize(("runtime", "ws"), SMALL)
def test_an_operation_on_a_second_stream_orders_with_that_stream(runtime: str,
                                                                 ws: int) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        _eq(res["order/second_stream"], _sum(ws, 4, 82), f"rank {rank}")
        _eq(res["order/first_stream"], _sum(ws, 4, 81), f"rank {rank}")


@pytest.mark.parametrize(("runtime", "ws"), PAIRS)
def test_wait_does_not_block_the_host_but_later_stream_work_sees_the_result(
        runtime: str, ws: int) -> None:
    res = results(runtime, ws)[0]
    assert res["order/wait_returned_while_copy_back_pending"] is True
    _eq(res["order/async_result"], _sum(ws, 4, 90), "rank 0")


@pytest.mark.parametrize(("runtime", "ws"), PAIRS)
def test_a_synchronous_call_returns_with_the_current_stream_ordered_after_its_copy_back(
        runtime: str, ws: int) -> None:
    res = results(runtime, ws)[1]
    assert res["order/recv_returned_while_copy_back_pending"] is True
    _eq(res["order/sync_result"], R.values(0, 4, 92), "rank 1")


@pytest.mark.parametrize(("runtime", "ws"), PAIRS)
def test_the_caller_may_free_its_tensor_after_wait(runtime: str, ws: int) -> None:
    _eq(results(runtime, ws)[0]["order/after_free"], np.full(4, 7.0, np.float32), "rank 0")


@pytest.mark.parametrize(("runtime", "ws"), SMALL)
def test_while_the_feature_is_closed_device_tensors_get_todays_behaviour(runtime: str,
                                                                         ws: int) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        if runtime == "cuda":
            assert res["closed/error"] == (
                "ProcessGroup::allreduce: ringtorch's native backend runs on CPU tensors; got a "
                "tensor on cuda:0 (move it with .cpu(), or wait for the nccl backend)")
        else:  # host memory, reduced at the call (zeros), before the queued fill landed
            _eq(res["closed/sim"], R.values(rank, 4, 95), f"rank {rank}")

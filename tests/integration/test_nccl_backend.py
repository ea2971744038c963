"""Backend "nccl" and the backend map "cpu:gloo,cuda:nccl" (ringtorch/distributed/_nccl.py).

One set of test bodies over two runtimes: ``sim`` (the simulated device with the fake NCCL,
RINGTORCH_NCCL_FAKE=1: worlds 1-4, in the default suite) and ``cuda`` (the NCCL library on a
GPU, world 1; marked gpu(1) and nccl_lib, run by the GPU check). The feature is opened with
RINGTORCH_DEVICE_UNCONFIRMED=1, as the GPU check does; world 2 names no backend (the default
map), world 3 the map "cpu:gloo,cuda:nccl", the others "nccl". One world per (runtime, size) runs every case
(tests/integration/_nccl_ranks.py); expected values come from NumPy over inputs the test
rebuilds itself. The closed behaviour (no switch: today's messages) runs in this process.
"""

from __future__ import annotations

import functools
from datetime import timedelta

import numpy as np
import pytest
import torch

import ringtorch.distributed as dist
from ringtorch import _config
from ringtorch.store import HashStore
from ringtorch.testing import run_ranks
from tests.integration import _nccl_ranks as R
from tests.integration._device_staging_ranks import values

GPU = (pytest.mark.gpu(1), pytest.mark.nccl_lib)
WORLDS = [("sim", 1), ("sim", 2), ("sim", 3), ("sim", 4), pytest.param("cuda", 1, marks=GPU)]
SMALL = [("sim", 1), ("sim", 2), pytest.param("cuda", 1, marks=GPU)]
N = R.N
CLOSED = ("Backend 'nccl' is not available: the NCCL backend is not available in this version "
          "of ringtorch: it needs CUDA GPUs and the NCCL library, and stays off until it has "
          "been confirmed on a GPU. ringtorch runs collectives on CPU tensors: use backend='gloo' "
          "(ringtorch's native CPU backend).")


def _backend(ws: int) -> str | None:
    """What each world names: world 2 nothing (the default map, "cpu:gloo,cuda:nccl" where
    NCCL is available, as in torch), world 3 the map, the others "nccl"."""
    return {2: None, 3: "cpu:gloo,cuda:nccl"}.get(ws, "nccl")


def results(runtime: str, ws: int) -> list[dict]:
    outcome = _run(runtime, ws)
    if isinstance(outcome, BaseException):  # one failed job fails its tests, once
        raise outcome
    return outcome


@functools.cache
def _run(runtime: str, ws: int) -> list[dict] | BaseException:
    env = {"RINGTORCH_DEVICE_RUNTIME": runtime, "RINGTORCH_DEVICE_UNCONFIRMED": "1"}
    if runtime == "sim":
        env["RINGTORCH_NCCL_FAKE"] = "1"
    try:
        return run_ranks(R.run, ws, args=(_backend(ws),), timeout=150, env=env)
    except Exception as exc:
        return exc


def _sum(ws: int, n: int, salt: int) -> np.ndarray:
    return np.sum([values(r, n, salt) for r in range(ws)], axis=0)


def _eq(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    np.testing.assert_array_equal(got, expected, err_msg=what)


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_every_rank_ran_nccl_on_the_runtime_asked_for(runtime: str, ws: int) -> None:
    for res in results(runtime, ws):
        assert (res["runtime"], res["backend"], res["available"]) == (
            runtime, _backend(ws) or "undefined", True)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_collectives_on_device_tensors_match_numpy(runtime: str, ws: int, mode: str) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        _eq(res[f"{mode}/all_reduce"], _sum(ws, N, 1), f"all_reduce rank {rank}")
        _eq(res[f"{mode}/broadcast"], values(ws - 1, N, 2), f"broadcast rank {rank}")
        if rank == 0:
            _eq(res[f"{mode}/reduce"], _sum(ws, N, 3), "reduce on dst")
        for r in range(ws):
            _eq(res[f"{mode}/all_gather"][r], values(r, N, 4), f"all_gather rank {rank}")
        _eq(res[f"{mode}/all_gather_into_tensor"],
            np.concatenate([values(r, N, 5) for r in range(ws)]), f"into_tensor rank {rank}")
        _eq(res[f"{mode}/reduce_scatter"], _sum(ws, N, 8 + rank), f"reduce_scatter {rank}")
        _eq(res[f"{mode}/reduce_scatter_tensor"], _sum(ws, N * ws, 20)[rank * N:(rank + 1) * N],
            f"reduce_scatter_tensor rank {rank}")


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_gather_scatter_and_all_to_all_on_device_tensors(runtime: str, ws: int,
                                                          mode: str) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        if rank == 0:
            for r in range(ws):
                _eq(res[f"{mode}/gather"][r], values(r, N, 6), f"gather part {r}")
        else:
            assert res[f"{mode}/gather"] is None
        _eq(res[f"{mode}/scatter"], values(rank, N, 7), f"scatter rank {rank}")
        for r in range(ws):
            _eq(res[f"{mode}/all_to_all"][r], values(r, N, 30 + rank), f"all_to_all {rank}")
        _eq(res[f"{mode}/all_to_all_single"],
            np.concatenate([values(r, N * ws, 40)[rank * N:(rank + 1) * N] for r in range(ws)]),
            f"all_to_all_single rank {rank}")


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_reduction_ops_on_device_tensors_match_numpy(runtime: str, ws: int) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        _eq(res["max"], np.max([values(r, N, 11) for r in range(ws)], axis=0), f"max {rank}")
        np.testing.assert_allclose(res["avg"], _sum(ws, N, 12) / ws, err_msg=f"avg {rank}")
        _eq(res["premul_sum"], 2 * _sum(ws, N, 13), f"premul_sum rank {rank}")
        assert res["band"] == "ValueError: Cannot use ReduceOp.BAND with NCCL"


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(("runtime", "ws"), [("sim", 2), ("sim", 3), ("sim", 4)])
def test_send_and_recv_on_device_tensors(runtime: str, ws: int, mode: str) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        _eq(res[f"{mode}/send_recv"], values((rank - 1) % ws, N, 50), f"recv rank {rank}")
        if mode == "sync":
            assert res["sync/recv_returns"] == (rank - 1) % ws


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_coalesced_forms_are_staged_and_a_batch_is_one_nccl_group(runtime: str, ws: int) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        got = res["staged/all_reduce_coalesced"]
        _eq(got[0], _sum(ws, 4, 60), f"coalesced part 0 rank {rank}")
        _eq(got[1], _sum(ws, 3, 61), f"coalesced part 1 rank {rank}")
        if ws > 1:
            _eq(res["batch_isend_irecv"], values((rank - 1) % ws, 5, 70), f"batch {rank}")


@pytest.mark.parametrize(("runtime", "ws"), [("sim", 3), ("sim", 4)])
def test_a_subgroup_runs_on_its_own_communicator(runtime: str, ws: int) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        if rank in (0, 2):
            _eq(res["subgroup"], values(0, N, 15) + values(2, N, 15), f"subgroup rank {rank}")
            assert res["subgroup_own_side"] is True
        else:
            assert "subgroup" not in res


@pytest.mark.parametrize(("runtime", "ws"), SMALL)
def test_an_operation_includes_queued_work_and_never_blocks_the_host(runtime: str,
                                                                     ws: int) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        # the call and wait() returned while the current stream was still busy...
        assert res["order/sync_returned_before_queued_work"], f"rank {rank}"
        assert res["order/async_not_done_before_queued_work"], f"rank {rank}"
        assert res["order/wait_did_not_block_host"], f"rank {rank}"
        # ...and the work queued before the call is what was reduced
        _eq(res["order/queued_work_included"], 2 * _sum(ws, 4, 80), f"queued work {rank}")
        _eq(res["order/after_wait"], 2 * _sum(ws, 4, 81), f"after wait rank {rank}")
        assert res["order/completed_after_read"], f"rank {rank}"


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_cpu_tensors_go_to_the_cpu_backend_and_device_tensors_to_nccl(runtime: str,
                                                                      ws: int) -> None:
    for rank, res in enumerate(results(runtime, ws)):
        # (CPU backend's collectives, NCCL side's operations) each call added
        assert res["dispatch/cpu_moved"] == (1, 0), f"rank {rank}"
        assert res["dispatch/device_moved"] == (0, 1), f"rank {rank}"
        _eq(res["dispatch/cpu"], _sum(ws, N, 90), f"cpu rank {rank}")
        _eq(res["dispatch/device"], _sum(ws, N, 91), f"device rank {rank}")


def test_closed_nccl_keeps_todays_messages() -> None:
    assert not _config.DEVICE_UNCONFIRMED.get() and not _config.NCCL_FAKE.get()
    assert dist.is_nccl_available() is False
    assert dist.is_backend_available("cpu:gloo,cuda:nccl") is False
    with pytest.raises(RuntimeError, match=f"^{_re(CLOSED)}$"):
        dist.init_process_group("nccl", store=HashStore(), rank=0, world_size=1)
    with pytest.raises(ValueError, match=_re(
            "device_id cuda:0 is not available: ringtorch runs collectives on CPU tensors (an "
            "accelerator backend is not available yet)")):
        dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    # the map runs its CPU tensors as before, with no NCCL side
    dist.init_process_group("cpu:gloo,cuda:nccl", store=HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        assert dist.group.WORLD.device_backend is None
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_open_nccl_without_a_gpu_says_what_it_needs() -> None:
    with _config.override(DEVICE_UNCONFIRMED=True):
        assert dist.is_nccl_available() is False
        with pytest.raises(RuntimeError, match=_re(
                "Backend 'nccl' is not available: the NCCL backend needs a CUDA GPU, and torch "
                "sees none. Use backend='gloo' (ringtorch's native CPU backend).")):
            dist.init_process_group("nccl", store=HashStore(), rank=0, world_size=1)


def test_a_group_without_nccl_takes_device_tensors_as_before_while_staging_is_closed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # "nccl" open (the switch), staging closed (as once nccl_backend is confirmed and
    # cuda_tensors is not): a "gloo" group runs its entry point as it is, without staging
    from ringtorch import _device
    from ringtorch.distributed import _device_staging

    monkeypatch.setattr(_device_staging, "opened", lambda: False)
    with _config.override(DEVICE_UNCONFIRMED=True, DEVICE_RUNTIME="sim", NCCL_FAKE="1"):
        rt = _device.runtime()
        dist.init_process_group("gloo", store=HashStore(), rank=0, world_size=1)
        try:
            t = rt.empty((3,), torch.float32, 0)
            t.fill_(2.0)
            dist.all_reduce(t)
            assert t.tolist() == [2.0, 2.0, 2.0]
            assert ("sim", 0) not in _device_staging._state.streams  # nothing was staged
        finally:
            dist.destroy_process_group()


def _re(text: str) -> str:
    import re

    return re.escape(text)

"""all_reduce of device tensors between the ranks of one host over IPC-exported device memory
(ringtorch/distributed/_device_ipc.py), and the staging path where ranks span hosts.

``sim`` worlds 2-4 in the default suite; the ``cuda`` twin (marked gpu(1): world 2, both ranks
on GPU 0, a GPU shared as NCCL below 2.30 refuses) runs in the GPU check. The path is opened
with RINGTORCH_DEVICE_UNCONFIRMED=1 as the GPU check does. Expected sums come from NumPy over
inputs the test rebuilds itself (tests/integration/_device_ipc_ranks.py).
"""

from __future__ import annotations

import functools
import signal

import numpy as np
import pytest

from ringtorch.testing import run_ranks
from tests.integration import _device_ipc_ranks as R

WORLDS = [("sim", 2), ("sim", 4),  # world 3: the two-host and the killed-peer cases
          pytest.param("cuda", 2, marks=pytest.mark.gpu(1))]
ENV = {"RINGTORCH_DEVICE_UNCONFIRMED": "1", "RINGTORCH_DEBUG": "INFO"}


@functools.cache
def results(runtime: str, ws: int) -> list[dict]:
    return run_ranks(R.run, ws, timeout=120, env={**ENV, "RINGTORCH_DEVICE_RUNTIME": runtime})


def _sum(ws: int, n: int, dtype: str) -> np.ndarray:
    return np.sum([R.values(r, n, dtype) for r in range(ws)], axis=0)


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_all_reduce_over_ipc_matches_numpy_for_uneven_sizes_and_dtypes(runtime: str,
                                                                       ws: int) -> None:
    res = results(runtime, ws)
    for rank, got in enumerate(res):
        for dtype in R.DTYPES:
            for n in R.SIZES:
                np.testing.assert_array_equal(got[f"{dtype}/{n}"], _sum(ws, n, dtype),
                                              err_msg=f"{dtype}/{n} rank {rank}")
        # every one of those calls took the IPC path (none was staged), and each rank says so
        assert got["rounds"] == len(R.DTYPES) * len(R.SIZES)
        assert list(got["paths"].values()) == ["ipc"]
        assert len(got["log"]) == 1 and got["log"][0].startswith(
            f"group '{next(iter(got['paths']))}' rank {rank}: all_reduce, broadcast and "
            f"all_gather of device tensors take the ipc path (its {ws} ranks are on this "
            f"host, from the group's rendezvous)"), got["log"]
        assert got["leftover"] == [], f"rank {rank}"  # its device memory went with its group


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_calls_that_differ_per_rank_in_form_take_the_same_path(runtime: str, ws: int) -> None:
    # rank 0 asynchronous, rank 1 a non-contiguous view, the others plain: one IPC round
    for rank, got in enumerate(results(runtime, ws)):
        np.testing.assert_array_equal(got["mixed"], _sum(ws, 9, "float32"),
                                      err_msg=f"rank {rank}")
        assert got["mixed_rounds"] == 1, f"rank {rank}"
    assert results(runtime, ws)[0]["async_returned"] is True
    untouched = np.repeat(R.values(1, 9, "float32"), 2)[1::2]  # the elements between the view's
    np.testing.assert_array_equal(results(runtime, ws)[1]["untouched"], untouched)


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_avg_of_floating_point_is_the_sum_divided_on_the_device(runtime: str, ws: int) -> None:
    for rank, got in enumerate(results(runtime, ws)):
        np.testing.assert_array_equal(got["avg"], _sum(ws, 11, "float32") / ws,
                                      err_msg=f"rank {rank}")
        assert got["avg_rounds"] == 1, f"rank {rank}"


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_broadcast_and_all_gather_of_uneven_sizes_over_ipc(runtime: str, ws: int) -> None:
    for rank, got in enumerate(results(runtime, ws)):
        np.testing.assert_array_equal(got["broadcast"], R.values(ws - 1, 1001, "float32"),
                                      err_msg=f"broadcast rank {rank}")
        for r in range(ws):
            np.testing.assert_array_equal(got["all_gather"][r], R.values(r, 3 + 2 * r, "int64"),
                                          err_msg=f"all_gather part {r} rank {rank}")
        assert got["bcast_gather_rounds"] == 2, f"rank {rank}"


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_work_queued_on_the_callers_stream_is_included(runtime: str, ws: int) -> None:
    for rank, got in enumerate(results(runtime, ws)):
        np.testing.assert_array_equal(got["order"], _sum(ws, 7, "float32"),
                                      err_msg=f"rank {rank}")


@pytest.mark.parametrize(("runtime", "ws"), WORLDS[:1])
def test_while_the_feature_is_closed_the_ipc_path_does_not_run(runtime: str, ws: int) -> None:
    for got in results(runtime, ws):
        assert got["closed_rounds"] == 0
        np.testing.assert_array_equal(got["closed"], _sum(ws, 4, "float32"))


def test_ranks_on_two_hosts_take_the_staging_path_all_of_them() -> None:
    ws = 3
    res = run_ranks(R.two_hosts, ws, timeout=60, env={**ENV, "RINGTORCH_DEVICE_RUNTIME": "sim"})
    for rank, got in enumerate(res):
        for n in (5, 1001):
            np.testing.assert_array_equal(got[f"float32/{n}"], _sum(ws, n, "float32"),
                                          err_msg=f"rank {rank}")
        np.testing.assert_array_equal(got["async"], _sum(ws, 5, "int64"), err_msg=f"{rank}")
        assert got["rounds"] == 0
        assert list(got["paths"].values()) == ["staging"]
        assert "take the staging path (its 3 ranks are on more than one host" in got["log"][0]


def test_a_peer_killed_mid_round_fails_the_survivors_naming_it() -> None:
    victim = 1
    res = run_ranks(R.killed, 3, args=(victim,), timeout=60,
                    env={**ENV, "RINGTORCH_DEVICE_RUNTIME": "sim"})
    assert res[victim]["signal"] == signal.SIGKILL
    for rank in (0, 2):
        got = res[rank]
        assert got["error"] == "PeerLostError", got
        assert got["message"].startswith(
            f"all_reduce on device tensors (group '{got['group']}'): rank {victim}'s "
            f"process exited while rank {rank} waited for it"), got["message"]
        assert got["rounds"] == 3  # the round the victim died in completed here; the next failed
        assert got["seconds"] < 10  # well within the group's 20 s timeout: no hang
        assert got["leftover"] == [], f"rank {rank}"

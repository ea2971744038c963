"""all_reduce of device tensors between the ranks of one host over IPC-exported device memory
(ringtorch/distributed/_device_ipc.py).

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

WORLDS = [("sim", 2), ("sim", 3), ("sim", 4),
          pytest.param("cuda", 2, marks=pytest.mark.gpu(1))]
ENV = {"RINGTORCH_DEVICE_UNCONFIRMED": "1"}


@functools.cache
def results(runtime: str, ws: int) -> list[dict]:
    return run_ranks(R.run, ws, timeout=120, env={**ENV, "RINGTORCH_DEVICE_RUNTIME": runtime})


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_all_reduce_over_ipc_matches_numpy_for_uneven_sizes_and_dtypes(runtime: str,
                                                                       ws: int) -> None:
    res = results(runtime, ws)
    for rank, got in enumerate(res):
        for dtype in R.DTYPES:
            for n in R.SIZES:
                expected = np.sum([R.values(r, n, dtype) for r in range(ws)], axis=0)
                np.testing.assert_array_equal(got[f"{dtype}/{n}"], expected,
                                              err_msg=f"{dtype}/{n} rank {rank}")
        # every one of those calls took the IPC path (none was staged)
        assert got["rounds"] == len(R.DTYPES) * len(R.SIZES)
        assert got["leftover"] == [], f"rank {rank}"  # its device memory went with its group


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_work_queued_on_the_callers_stream_is_included(runtime: str, ws: int) -> None:
    expected = np.sum([R.values(r, 7, "float32") for r in range(ws)], axis=0)
    for rank, got in enumerate(results(runtime, ws)):
        np.testing.assert_array_equal(got["order"], expected, err_msg=f"rank {rank}")


@pytest.mark.parametrize(("runtime", "ws"), WORLDS[:1])
def test_while_the_feature_is_closed_the_ipc_path_does_not_run(runtime: str, ws: int) -> None:
    expected = np.sum([R.values(r, 4, "float32") for r in range(ws)], axis=0)
    for got in results(runtime, ws):
        assert got["closed_rounds"] == 0
        np.testing.assert_array_equal(got["closed"], expected)


def test_a_peer_killed_between_rounds_fails_the_survivors_naming_it() -> None:
    victim = 1
    res = run_ranks(R.killed, 3, args=(victim,), timeout=60,
                    env={**ENV, "RINGTORCH_DEVICE_RUNTIME": "sim"})
    assert res[victim]["signal"] == signal.SIGKILL
    for rank in (0, 2):
        got = res[rank]
        assert got["error"] == "PeerLostError", got
        assert got["message"].startswith(
            f"all_reduce on device tensors (group '{res[rank]['group']}'): rank {victim}'s "
            f"process exited while rank {rank} waited for it"), got["message"]
        assert got["seconds"] < 10  # well within the group's 20 s timeout: no hang
        assert got["leftover"] == [], f"rank {rank}"

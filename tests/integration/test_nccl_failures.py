"""Backend "nccl" under failure, on the fake NCCL and the simulated runtime: a hung init is
aborted at the timeout, an operation past the timeout aborts the communicator, a killed peer
fails the survivors' operation naming it within seconds, and ranks sharing one GPU under an
NCCL older than 2.30 run on the staged path, said once. Two jobs: the faults at world 2 one
after the other in the same processes, the killed peer at world 3
(tests/integration/_nccl_ranks.py). The fake has no timeout of its own (NCCL has none): only
the group's watchdog ends a stalled operation or a hung init.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from ringtorch.testing import run_ranks
from tests.integration import _nccl_ranks as R
from tests.integration._device_staging_ranks import values

ENV = {"RINGTORCH_DEVICE_RUNTIME": "sim", "RINGTORCH_DEVICE_UNCONFIRMED": "1",
       "RINGTORCH_NCCL_FAKE": "1"}
N = R.N


@functools.cache
def faults() -> list[dict]:
    return run_ranks(R.faults, 2, timeout=150, env=ENV)


@functools.cache
def killed() -> list[dict]:
    return run_ranks(R.killed, 3, args=(2,), timeout=150, env=ENV)


def test_a_hung_init_is_aborted_at_the_timeout_with_a_message() -> None:
    for rank, res in enumerate(faults()):
        assert res["hung_init"] == (
            f"DistBackendError: the NCCL communicator of group '0' was not ready on rank {rank} "
            f"within 0:00:02 (its init was still in progress: a peer did not join); it was "
            f"aborted")
        assert res["hung_init_s"] < 30, "bounded by the group's timeout, not by the fake"
        assert res["initialized_after_hung_init"] is False


def test_device_id_binds_the_group_to_the_device() -> None:
    for res in faults():
        assert res["bound"] == "cuda:0"


def test_an_operation_past_the_timeout_aborts_the_communicator_and_names_the_rank() -> None:
    # rank 1's operation stalls (never completes), rank 0's waits for it: each fails at its
    # own group timeout (2 s and 6 s), not at the fake's, which has none
    for rank, res in enumerate(faults()):
        said = (f"NCCL communicator of group '0' aborted on rank {rank}: allreduce #0 timed "
                f"out after 0:00:0{2 + 4 * rank}")
        assert res["timeout"] == said
        assert res["timeout_s"] < 30
        assert res["timeout_wait"] == f"DistBackendError: {said}"
        assert res["after_timeout"] == f"DistBackendError: {said}", "later calls fail at once"


def test_ranks_sharing_a_gpu_below_nccl_2_30_reduce_over_ipc_and_say_so_once() -> None:
    for rank, res in enumerate(faults()):
        np.testing.assert_array_equal(
            res["shared/first"], np.sum([values(r, N, 3) for r in range(2)], axis=0))
        np.testing.assert_array_equal(
            res["shared/second"], np.sum([values(r, N, 4) for r in range(2)], axis=0))
        assert res["shared/said"] == [
            "ProcessGroup 'nccl' (group '0'): ranks of this group share one GPU, which NCCL "
            "2.28.9 refuses (2.30 or later accepts it); its all_reduce, broadcast and "
            "all_gather run over IPC between the ranks' device buffers instead, its other "
            "operations on device tensors on ringtorch's staged path"], f"rank {rank}"
        assert res["shared/paths"] == ["ipc"], f"rank {rank}"


def test_a_killed_peer_fails_the_survivors_naming_it_within_seconds() -> None:
    results = killed()
    assert results[2] == {"signal": 9}
    for rank, res in enumerate(results[:2]):
        np.testing.assert_array_equal(res["first"],
                                      np.sum([values(r, N, 1) for r in range(3)], axis=0))
        # found by the fake's own connections (its message names the peer), by the probe of
        # the group's processes on this host, or both
        assert re.fullmatch(
            rf"NCCL communicator of group '0' aborted on rank {rank}: (the NCCL communicator "
            rf"reported ncclRemoteError(; rank 2 has exited)? \(.*rank 2 .*\)|a peer is gone; "
            rf"rank 2 has exited)", res["error"]), res["error"]
        assert res["seconds"] < 20, "noticed well before the group's 60 s timeout"
        assert res["next"] == f"DistBackendError: {res['error']}"

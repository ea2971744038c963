"""Failures and bad input at the facade: errors raised before anything is sent, monitored
barriers that name the missing ranks, DETAIL fingerprints, backend names.

Messages are matched in full where torch defines them, so that they stay greppable.
"""

from __future__ import annotations

import functools

import pytest

from ringtorch.testing import check_backend, run_ranks
from tests.integration import _failures_ranks as F


@functools.cache
def bad(ws: int) -> list[dict]:
    return run_ranks(F.bad_arguments, ws, timeout=60)


def _pg(op: str, message: str) -> tuple[str, str]:
    return ("RuntimeError", f"ProcessGroup::{op}: {message}")


@pytest.mark.parametrize("ws", [2, 4])
def test_invalid_arguments_raise_before_anything_is_sent(ws: int) -> None:
    for rank, res in enumerate(bad(ws)):
        root = rank == 0
        assert res["bcast_src_5"] == _pg("broadcast", "invalid root rank: 5")
        assert res["bcast_src_neg"] == _pg("broadcast", "invalid root rank: -1")
        assert res["reduce_dst_7"] == _pg("reduce", "invalid root rank: 7")
        if root:
            assert res["gather_len"] == _pg("gather", f"Incorrect output list size {ws + 1}. "
                                            f"Output list size should be {ws}, same as size "
                                            f"of the process group.")
            assert res["gather_size"] == _pg("gather", "invalid tensor size at index 0 "
                                                       "(expected (2), got (3))")
            assert res["scatter_len"] == _pg("scatter", f"Incorrect input list size {ws + 1}. "
                                             f"Input list size should be {ws}, same as size "
                                             f"of the process group.")
            assert res["scatter_size"] == _pg("scatter", "invalid tensor size at index 0 "
                                                         "(expected (2), got (3))")
        if rank != 1:
            assert res["gather_list_elsewhere"] == (
                "ValueError", "Argument ``gather_list`` must NOT be specified on "
                              "non-destination ranks.")
            assert res["scatter_elsewhere"] == (
                "ValueError", "Argument ``scatter_list`` must NOT be specified on non-source "
                              "ranks.")
        assert res["scatter_missing"] == (
            "ValueError", "Argument ``scatter_list`` must be specified on source rank.")
        assert res["ag_len"] == _pg("allgather", f"invalid output tensor list at index 0 "
                                                 f"(expected length {ws}, got {ws + 1})")
        assert res["ag_own_size"] == _pg("allgather", "invalid tensor size at index 0 "
                                                      "(expected (2), got (3))")
        assert res["ag_dtype"] == ("ValueError", "Invalid usage of tensors with different "
                                                 "dtypesFound torch.int32 and  torch.float32")
        assert res["ag_tuple"][0] == "TypeError"
        assert res["agt_size"] == _pg("all_gather_single", "output tensor size must be equal "
                                                           "to world_size times input tensor "
                                                           "size")
        assert res["rs_len"] == ("RuntimeError",
                                 "invalid input tensor list size, must be world size")
        assert res["rs_size"] == _pg("reduce_scatter", "invalid tensor size at index 0 "
                                                       "(expected (3), got (2))")
        assert res["rst_size"] == _pg("reduce_scatter_single", "input tensor must be the same "
                                      "size as output size times world size")
        assert res["a2a_sum"] == ("RuntimeError", "Split sizes doesn't match total dim 0 size")
        assert res["a2a_count"] == ("RuntimeError",
                                    "Number of tensor splits not equal to group size")
        assert res["a2a_uneven"] == ("ValueError",
                                     "Tensor's dim 0 does not divide equally across group size")
        assert res["a2a_strided"] == ("ValueError", "Tensors must be contiguous")
        assert res["a2a_list_len"] == _pg("alltoall", f"input tensor list size {ws + 1} does "
                                                      f"not match world size {ws}")
        assert res["a2a_self"] == ("ValueError", "alltoall_base: this rank sends itself 1 "
                                                 "elements but expects 2")
        assert res["band_float"] == ("RuntimeError", "Cannot use ReduceOp.BAND with "
                                                     "non-integral dtype torch.float32")
        assert res["max_complex"] == ("ValueError",
                                      "all_reduce does not support RedOpType.MAX on complex "
                                      "tensors")
        assert res["avg_int"][0] == "RuntimeError" and "AVG" in res["avg_int"][1]
        assert res["readonly_array"] == (
            "ValueError", "the output array `tensor` has negative strides: results cannot be "
                          "written into it; pass a writable array (e.g. np.ascontiguousarray(a))")
        assert res["not_a_tensor"][0] == "TypeError"
        assert res["barrier_timeout_type"] == (
            "TypeError", "Expected timeout argument to be of type datetime.timedelta, got 5")
        assert res["new_group_range"] == ("ValueError", f"Rank {ws} is out of range. Valid "
                                          f"ranks are 0 to {ws - 1} (world_size={ws})")
        assert res["new_group_dup"] == ("ValueError", "ranks list must not contain duplicate "
                                                      "entries, got [0, 0]")
        assert res["new_group_timeout"] == (
            "TypeError", "Expected timeout argument to be of type datetime.timedelta, got 5")
        assert res["init_twice"] == ("ValueError",
                                     "trying to initialize the default process group twice!")
        assert res["wait_timeout"] == (
            "DistBackendError", "recv on group '0' did not complete within 0:00:00.200000 (Work.wait timed "
                                "out; the operation itself keeps its own deadline)")
        assert res["seq_unchanged"] is True
        assert res["after"] == [float(sum(range(1, ws + 1)))] * 3
        if ws == 4 and rank in (0, 1):
            kind, message = res["outside_group"]
            assert kind == "ValueError" and message.startswith("Global rank 3 is not part of "
                                                               "group <ProcessGroup")


def test_monitored_barrier_names_the_first_missing_rank_fast() -> None:
    results = run_ranks(F.monitored, 3, args=([1], False), timeout=60)
    kind, message = results[0]["error"]
    assert kind == "DistBackendError"
    assert message.startswith("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms\n "
                              "Original exception: \n")
    assert results[0]["elapsed"] < 5
    for rank in (1, 2):
        kind, message = results[rank]["error"]
        assert message.startswith(f"Rank {rank} successfully reached monitoredBarrier, but "
                                  f"received errors while waiting for send/recv from rank 0. "
                                  f"Please check rank 0 logs for faulty rank.")
    assert results[2]["elapsed"] < 5  # rank 0 told it at once


def test_monitored_barrier_with_wait_all_ranks_names_every_missing_rank() -> None:
    results = run_ranks(F.monitored, 4, args=([1, 3], True), timeout=60)
    assert results[0]["error"] == ("DistBackendError",
                                   "[Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in "
                                   "1000 ms")
    assert results[0]["elapsed"] < 5


def test_monitored_barrier_passes_and_warns_about_a_float_timeout() -> None:
    results = run_ranks(F.monitored_ok, 3, timeout=60)
    for res in results:
        assert res["warnings"] == ["Please specify timeout arg as a timedelta. Converting "
                                   "current value of 5.0 assuming it represents seconds"]


@pytest.mark.parametrize("case, differs", [
    ("shape", "tensor shapes: [[2]] vs [[3]]"),
    ("op", "op type: ALLREDUCE vs BROADCAST"),
    ("dtype", "tensor dtypes: ['float32'] vs ['float64']"),
])
def test_detail_mode_reports_mismatched_collectives_on_every_rank(case: str, differs: str) -> None:
    results = run_ranks(F.detail_mismatch, 2, args=(case,), timeout=60,
                        env={"RINGTORCH_DEBUG": "DETAIL"})
    for rank, res in enumerate(results):
        assert res["level"] == "DETAIL"
        kind, message = res["error"]
        assert kind == "DistBackendError"
        assert message.startswith(f"Detected mismatch between collectives on ranks. Rank {rank}"
                                  f" is running collective: CollectiveFingerPrint("
                                  f"SequenceNumber=0, ")
        assert f"but Rank {1 - rank} is running collective" in message
        if rank == 0:
            assert message.endswith("Collectives differ in the following aspects: " + differs)
        assert res["after"] == [2.0, 2.0]  # nothing was sent: the group still works


def test_detail_mode_names_a_rank_that_never_arrives() -> None:
    results = run_ranks(F.detail_mismatch, 2, args=("missing",), timeout=60,
                        env={"RINGTORCH_DEBUG": "DETAIL"})
    kind, message = results[0]["error"]
    assert kind == "DistBackendError"
    assert message.startswith("allreduce #0 on group '0': ranks [1] did not reach this "
                              "collective within 0:00:02")


def test_without_detail_mismatched_sizes_are_refused_not_computed() -> None:
    results = run_ranks(F.no_detail_mismatch, 2, timeout=60)
    for res in results:
        kind, message = res["error"]
        assert kind == "DistBackendError" and "mismatch" in message


def test_backend_names_unknown_unavailable_and_user_registered() -> None:
    res = run_ranks(F.backends, 1, timeout=60)[0]
    kind, message = res["unknown"]
    assert kind == "RuntimeError"
    assert message.startswith("Unknown c10d backend type NOSUCH: no backend named 'nosuch' is "
                              "registered")
    assert "Backend.register_backend('nosuch', ...)" in message
    kind, message = res["nccl"]
    assert kind == "RuntimeError"
    assert message.startswith("Backend 'nccl' is not available: the NCCL backend is not "
                              "available in this version of ringtorch: it needs CUDA GPUs")
    assert res["still_uninitialized"] is False
    assert res["timeout_type"] == ("TypeError", "Expected timeout argument to be of type "
                                                "datetime.timedelta, got 30")
    assert res["available"] == (True, True, False, True, False)
    assert res["loop"] == ("loop", [10.0, 10.0], "loop")
    assert res["no_backend"] == ("undefined", "cpu:gloo", "gloo", None)
    assert res["gloo_config"] == "cpu:gloo,cuda:gloo"


def test_uncaught_exceptions_are_prefixed_with_the_rank_and_init_barrier_works() -> None:
    results = run_ranks(F.excepthook_and_init_barrier, 2, timeout=60,
                        env={"TORCH_DIST_INIT_BARRIER": "1"})
    for rank, res in enumerate(results):
        lines = [line for line in res["report"].split("\n") if line]
        assert lines and all(line.startswith(f"[rank{rank}]: ") for line in lines)
        assert lines[-1] == f"[rank{rank}]: KeyError: 'boom'"
        assert res["restored"] is True


def test_detail_mode_runs_a_correct_program_without_false_alarms() -> None:
    """The conformance suite (uneven all_gather and all_to_all parts, root-only lists, p2p,
    async forms) under DETAIL's cross-rank fingerprint checks: no collective is refused."""
    check_backend("gloo", 3, env={"RINGTORCH_DEBUG": "DETAIL"})

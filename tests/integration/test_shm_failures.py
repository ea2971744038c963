"""The shared-memory fast path when things go wrong, and under load: mismatched collectives,
a rank killed mid all_reduce, a late rank, an abort, no segment left in /dev/shm whatever
way the job ends, and a stress run of mixed back-to-back collectives.

Ranks run tests/integration/_shm_ranks.py. Time bounds are generous upper bounds on "fails
within N seconds" (the machines are noisy); nothing here measures speed.
"""

from __future__ import annotations

import os
import re
import threading

import pytest

from ringtorch.testing import RankFailed, frozen, run_ranks, wait_for
from tests.integration import _shm_leave_ranks as leave_ranks
from tests.integration import _shm_ranks as ranks

AR = r"all_reduce #1 \(float32, 32 bytes, op SUM\)"
OTHER = {
    "op": r"broadcast #1 \(float32, 32 bytes, root 0\)",
    "dtype": r"all_reduce #1 \(float64, 64 bytes, op SUM\)",
    "size": r"all_reduce #1 \(float32, 36 bytes, op SUM\)",
    "redop": r"all_reduce #1 \(float32, 32 bytes, op MAX\)",
}


@pytest.mark.parametrize("kind", sorted(OTHER))
def test_mismatched_collectives_fail_on_every_rank_naming_both_calls(kind):
    results = run_ranks(ranks.mismatch, 3, args=(kind,))
    for rank, (name, message) in enumerate(results):
        assert name == "ShmPeerError" or name == "DistBackendError", (rank, name, message)
        mine, theirs = (OTHER[kind], AR) if rank == 2 else (AR, OTHER[kind])
        other_rank = 0 if rank == 2 else 2
        assert re.search(rf"collective mismatch on group 'mm': rank {rank} called {mine} but "
                         rf"rank {other_rank} called {theirs}", message), (rank, message)


def test_a_shm_collective_against_a_socket_collective_is_a_mismatch():
    results = run_ranks(ranks.mismatch, 2, args=("socket_op",))
    want = (rf"collective mismatch on group 'mm': rank 0 called {AR} but rank 1 called "
            rf"all_to_all #1 \(float32, 32 bytes\)")
    for rank, (name, message) in enumerate(results):
        assert name in ("ShmPeerError", "DistBackendError"), (rank, name, message)
        assert re.search(want, message), (rank, message)


def test_broadcasts_with_different_roots_are_a_mismatch():
    results = run_ranks(ranks.root_mismatch, 2)
    for rank, (_name, message) in enumerate(results):
        mine, theirs = ("root 1", "root 0") if rank == 1 else ("root 0", "root 1")
        assert re.search(rf"rank {rank} called broadcast #1 \(float32, 16 bytes, {mine}\) but "
                         rf"rank {1 - rank} called broadcast #1 \(float32, 16 bytes, {theirs}\)",
                         message), (rank, message)


def test_matching_collectives_raise_nothing():
    assert run_ranks(ranks.mismatch, 2, args=("none",)) == [("no error", "")] * 2


def test_a_rank_late_for_the_first_collective_is_waited_for_not_taken_for_a_mismatch():
    assert run_ranks(ranks.late_for_the_first, 3) == [[6.0] * 4] * 3


def test_a_rank_killed_mid_all_reduce_fails_the_others_within_seconds_naming_it():
    results = run_ranks(ranks.killed_rank, 3, args=(1,), timeout=60)
    assert results[1] == {"victim_signal": 9}
    for rank in (0, 2):
        res = results[rank]
        name, message = res["first"]
        # seen through shared memory (its segment) or its sockets (EOF: PeerLostError)
        assert name in ("ShmPeerError", "DistBackendError", "PeerLostError"), message
        assert re.search(r"rank 1 (\(pid \d+\) died|(on host \S+ )?closed its connection)",
                         message), message
        assert res["failed_after"] < 5.0, res
        later_name, later = res["later"]
        assert later_name in ("DistBackendError", "PeerLostError"), later
        assert "the group was aborted" in later, later
        assert res["later_after"] < 1.0, res


def test_a_late_rank_times_out_the_others_naming_it_and_where_it_is(tmp_path):
    results = run_ranks(ranks.late_rank, 2, args=(1, str(tmp_path)), timeout=60)
    name, message = results[0]["error"]
    assert name == "ShmPeerError", message
    assert re.fullmatch(
        r"all_reduce #2 \(float32, 16 bytes, op SUM\) on group 'late' \(rank 0\) timed out "
        r"after 0:00:0[12] \(Timed out waiting 15\d\dms: the collective's timeout\): ranks \[1\] "
        r"did not arrive \(rank 1 is at broadcast #1 "
        r"\(float32, 16 bytes, root 0\)\)", message), message
    assert 1.4 < results[0]["after"] < 5.0
    # the late rank learns of the abort from rank 0's ABORT frame, or, when its all_reduce
    # starts first, from rank 0's segment (rank 0 arrived, then gave up): it fails either way
    late_name, late_message = results[1]["error"]
    assert late_name in ("DistBackendError", "ShmPeerError"), late_message
    assert "timed out" in late_message, late_message


@pytest.mark.parametrize("ws", [2, 4])
def test_a_rank_that_arrived_then_left_while_a_waiter_checked_on_it_was_not_late(ws):
    # rank 1 arrives at the barrier and closes its group between rank 0's read of its round
    # word and rank 0's probe of its process: it did arrive, so rank 0's barrier passes
    results = run_ranks(leave_ranks.arrive_then_leave, ws, timeout=60)
    assert results[0]["probed"]
    assert [r["error"] for r in results] == [("no error", "")] * ws


def test_abort_on_one_rank_ends_the_others_waits_with_its_reason():
    results = run_ranks(ranks.aborted, 3, timeout=30)
    for rank, res in enumerate(results):
        name, message = res["error"]
        assert name in ("ShmPeerError", "DistBackendError"), (rank, message)
        assert "rank 0 aborted the group: the user gave up" in message, (rank, message)
        assert res["after"] < 5.0, (rank, res)


def _leftovers(names: list[str]) -> list[str]:
    return [n for n in names if os.path.exists(os.path.join("/dev/shm", n))]


def _recorded(record: str, world_size: int) -> list[str]:
    names = []
    for rank in range(world_size):
        with open(f"{record}.{rank}") as f:
            names += f.read().split()
    return names


@pytest.mark.parametrize("how", ["close", "exception", "sigkill"])
def test_no_segment_is_left_in_dev_shm_however_the_job_ends(how, tmp_path):
    record = str(tmp_path / "names")
    if how == "close":
        run_ranks(ranks.leave, 3, args=(how, record))
    else:
        with pytest.raises(RankFailed) as info:
            run_ranks(ranks.leave, 3, args=(how, record))
        assert info.value.rank == 1
    names = _recorded(record, 3)
    assert len(names) == 9 and all(n.startswith("ringtorch_") for n in names), names
    assert _leftovers(names) == []


def test_a_setup_that_times_out_leaves_no_segment():
    (pid, error), _ = run_ranks(ranks.setup_abandoned, 2, timeout=30)
    assert re.fullmatch(r"DistBackendError: setting up shared memory failed: store keys "
                        r"\['rt_shm/seg/1'\] did not appear within 1\.0 s .*", error), error
    assert [n for n in os.listdir("/dev/shm") if n.startswith(f"ringtorch_{pid}_")] == []


def test_many_mixed_back_to_back_collectives_are_all_correct():
    results = run_ranks(ranks.stress, 3, args=(12345, 200), timeout=90)
    for rank, res in enumerate(results):
        assert res["bad"] == [] and res["count"] == 200, f"rank {rank}: {res}"


def test_mixed_collectives_with_rotating_one_shot_areas_and_staged_chunks_are_all_correct():
    # world 2 on 2 cores: one-shot all_reduces of 16-256 KiB rotate through 4 MiB slots
    # (shm_plan.ROTATE_HALF), between staged ones (> 256 KiB here) whose reduced slices are
    # read a round after they are written, and the other collectives
    knobs = {"SHM_CHUNK_BYTES": 64 * 1024, "SHM_ONESHOT_BYTES": 256 * 1024}
    sizes = [0, 100, 4096, 5000, 20_000, 50_000, 65_536, 100_000, 300_000]
    results = run_ranks(ranks.stress, 2, args=(777, 150, knobs, sizes), timeout=120)
    rotates = len(os.sched_getaffinity(0)) >= 2  # each rank can have a CPU (and caches)
    for rank, res in enumerate(results):
        assert res == {"bad": [], "count": 150, "rotated": rotates}, f"rank {rank}: {res}"


def test_a_frozen_rank_is_named_by_repeated_stall_warnings_on_shared_memory(tmp_path):
    pid_file, warned = tmp_path / "pid1", tmp_path / "warned"
    ranks_done: list = []

    def stop_then_release() -> None:
        try:
            with frozen(pid_file, "rank 1's pid"):  # it runs no Python, answers nothing
                wait_for(lambda: warned.exists() or ranks_done, timeout=60,
                         what="two warnings")
        finally:
            (tmp_path / "go").write_text("")

    releaser = threading.Thread(target=stop_then_release)
    releaser.start()
    try:
        results = run_ranks(ranks.frozen_peer, 2, args=(str(tmp_path),), timeout=90,
                            env={"RINGTORCH_STALL_WARNING_S": "0.3"})
    finally:
        ranks_done.append(True)
        releaser.join(60)
    assert [r["sum"] for r in results] == [[3.0] * 4, [3.0] * 4]
    warnings = results[0]["warnings"]
    assert len(warnings) >= 2, warnings
    waited = []
    for message in warnings:
        match = re.fullmatch(
            r"all_reduce #2 \(float32, 16 bytes, op SUM\) on group 'frozen' \(rank 0\) has "
            r"waited (\d+\.\d) s: ranks \[1\] have not arrived \(rank 1 is at broadcast #1 "
            r"\(float32, 16 bytes, root 0\)\)", message)
        assert match, message
        waited.append(float(match.group(1)))
    # the first after the configured time, each later one at twice the wait before it or
    # later (the message rounds to 0.1 s, hence the 0.15 s of slack)
    assert waited[0] >= 0.3, waited
    assert all(waited[i + 1] >= 2 * waited[i] - 0.15 for i in range(len(waited) - 1)), waited

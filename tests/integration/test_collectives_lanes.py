"""Lanes and Works on their own (no network): the ordering guarantees of
docs/design/group-ordering.md, G1 to G5 and G9, checked with a ``record`` list."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch

from ringtorch._errors import DistBackendError
from ringtorch._observe.operation import Operation
from ringtorch.collectives.comm_thread import Lane, LaneStatistics, WorkerPool
from ringtorch.collectives.work import Work
from ringtorch.testing import wait_for, wait_for_thread_in


def _work(record: list, name: str, gate: threading.Event | None = None,
          error: Exception | None = None) -> Work:
    def run(w: Operation) -> None:
        if gate is not None:
            assert gate.wait(5)
        record.append((name, w.seq, threading.get_ident()))
        if error is not None:
            raise error

    return Work(name, -1, run, [torch.zeros(1)], "g")


def test_g3_a_synchronous_work_on_an_idle_lane_runs_on_the_callers_thread() -> None:
    record: list = []
    lane = Lane("t")
    work = _work(record, "sync")
    lane.submit(work, inline=True, collective=True)
    assert work.is_completed() and record == [("sync", 0, threading.get_ident())]


def test_g2_g4_works_run_in_submission_order_and_a_sync_one_waits_behind_async_ones() -> None:
    record: list = []
    lane = Lane("t")
    release = threading.Event()
    first = _work(record, "async", gate=release)
    lane.submit(first, inline=False, collective=True)
    wait_for(lambda: lane.statistics().running, what="the async work to start")
    second = _work(record, "sync")
    lane.submit(second, inline=True, collective=True)  # queued: the lane is busy
    assert lane.statistics() == LaneStatistics(queued=1, running=True, submitted=2,
                                               completed=0, ran_inline=0, closed=False)
    release.set()
    second.wait()
    assert [(name, seq) for name, seq, _ in record] == [("async", 0), ("sync", 1)]
    assert record[1][2] != threading.get_ident()  # the communication thread ran it
    assert first.is_completed()


def test_statistics_count_what_was_submitted_what_ran_inline_and_what_completed() -> None:
    lane = Lane("t")
    lane.submit(_work([], "inline"), inline=True)
    queued = _work([], "queued")
    lane.submit(queued, inline=False)
    queued.wait()
    wait_for(lambda: lane.statistics().completed == 2, what="the lane's thread to finish")
    assert lane.statistics() == LaneStatistics(queued=0, running=False, submitted=2,
                                               completed=2, ran_inline=1, closed=False)
    lane.close(DistBackendError("closed"))
    assert lane.statistics().closed


def test_g1_sequence_numbers_follow_submission_order_across_threads() -> None:
    record: list = []
    lane = Lane("t")
    works: list[Work] = []
    lock = threading.Lock()

    def submit_many() -> None:
        for _ in range(50):
            w = _work(record, "x")
            with lock:
                works.append(w)
            lane.submit(w, inline=False, collective=True)

    threads = [threading.Thread(target=submit_many) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for w in works:
        w.wait()
    assert [seq for _, seq, _ in record] == list(range(150))


def test_g5_a_blocked_lane_does_not_hold_up_another_lane_of_the_pool() -> None:
    pool = WorkerPool("t")
    record: list = []
    release = threading.Event()
    blocked = Work("recv", -1, lambda w: release.wait(5), [], "g")
    Lane("a", pool).submit(blocked, inline=False)
    other = _work(record, "send")
    Lane("b", pool).submit(other, inline=False)
    other.wait(timedelta(seconds=5))
    assert not blocked.is_completed()
    release.set()
    blocked.wait(timedelta(seconds=5))


def test_g9_closing_a_lane_fails_queued_works_and_refuses_new_ones() -> None:
    lane = Lane("t")
    started, release = threading.Event(), threading.Event()
    running = Work("slow", -1, lambda w: (started.set(), release.wait(5)), [], "g")
    lane.submit(running, inline=False, collective=True)
    assert started.wait(5)  # the running Work is past the queue: close() lets it finish
    queued = _work([], "queued")
    lane.submit(queued, inline=False, collective=True)
    lane.close(DistBackendError("process group 'g' has been destroyed"))
    with pytest.raises(DistBackendError, match=r"^process group 'g' has been destroyed$"):
        queued.wait()
    with pytest.raises(DistBackendError, match=r"^process group 'g' has been destroyed$"):
        lane.submit(_work([], "late"), inline=True)
    release.set()
    running.wait(timedelta(seconds=5))


def test_work_reports_its_error_result_and_future() -> None:
    record: list = []
    ok = _work(record, "ok")
    ok.run()
    assert (ok.is_completed(), ok.is_success(), ok.exception()) == (True, True, None)
    assert ok.get_future().value()[0].tolist() == [0.0]
    assert ok.result()[0].tolist() == [0.0]
    failed = _work(record, "bad", error=DistBackendError("peer died"))
    future = failed.get_future()
    failed.run()
    assert (failed.is_completed(), failed.is_success()) == (True, False)
    assert str(failed.exception()) == "peer died"
    with pytest.raises(DistBackendError, match="^peer died$"):
        failed.wait()
    with pytest.raises(DistBackendError, match="peer died"):
        future.wait()


def test_work_wait_with_a_timeout_raises_while_the_operation_goes_on() -> None:
    pending = Work("recv", 3, lambda w: None, [], "g")
    with pytest.raises(DistBackendError, match=r"^recv #3 on group 'g' did not complete within "
                                               r"0:00:00.050000 \(Work.wait timed out"):
        pending.wait(timedelta(milliseconds=50))
    assert not pending.is_completed() and not pending.is_success()
    pending.run()
    assert pending.wait() is True


def test_join_returns_once_the_lanes_thread_has_finished_its_work_and_ended() -> None:
    # A destroyed group joins its lane's thread so that no thread of it is left inside a
    # torch call when the program exits.
    record: list = []
    lane = Lane("joined")
    gate = threading.Event()
    running = _work(record, "running", gate=gate)
    lane.submit(running, inline=False, collective=True)
    wait_for(lambda: lane.statistics().running, what="the work to start on the lane's thread")
    lane.close(DistBackendError("destroyed"))
    joined: list[bool] = []
    joiner = threading.Thread(target=lambda: joined.append(lane.join(5) is None))
    joiner.start()
    wait_for_thread_in(joiner, "join")  # the work ends only after join has begun
    gate.set()
    joiner.join(10)
    assert joined == [True] and not [t for t in threading.enumerate() if t.name == "joined-comm"]
    assert running.is_completed() and [name for name, _, _ in record] == ["running"]
    lane.join(5)  # nothing left to wait for


def test_a_join_that_runs_out_of_time_says_which_lane_still_runs(caplog) -> None:
    gate = threading.Event()
    lane = Lane("stuck")
    lane.submit(_work([], "blocked", gate=gate), inline=False, collective=True)
    wait_for(lambda: lane.statistics().running, what="the work to start on the lane's thread")
    lane.close(DistBackendError("destroyed"))
    lane.join(0.2)
    gate.set()
    assert ("stuck-comm: the thread of lane 'stuck' still runs a Work 0.2 s after its group "
            "was destroyed") in caplog.text

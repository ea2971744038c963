"""The summary's arithmetic: running totals per operation, the straggler verdict, the files.

The end-to-end behaviour (real jobs under ringrun) is tests/integration/test_job_summary.py;
here the inputs are written out so that each expected number can be checked by hand.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from random import Random
from types import SimpleNamespace

from ringtorch import _config
from ringtorch._observe.operation import Operation
from ringtorch._observe.recorder import COUNT_EVERY, FlightRecorder
from ringtorch._observe.summary import format_summary, read_summaries, stragglers
from ringtorch._observe.totals import Totals


def _record(kind: str, op: str, started: int, finished: int, nbytes: int = -1,
            call_bytes: int | None = None, error: str = "") -> Operation:
    """A finished record; ``started`` and ``finished`` in nanoseconds (records keep seconds)."""
    rec = FlightRecorder(4).record(kind, "0", op)
    rec.started, rec.finished, rec.nbytes = started * 1e-9, finished * 1e-9, nbytes
    if call_bytes is not None:
        rec.call = SimpleNamespace(nbytes=call_bytes)
    if error:
        rec.error = error
    return rec


def _summary(rank: int, ops: dict[str, tuple[str, int, int, int]]) -> dict:
    """ops: {op: (kind, calls, bytes, time_ns)}."""
    return {"format": "ringtorch-rank-summary", "version": 1, "rank": rank,
            "started_ns": 0, "written_ns": 10**9, "recording": True,
            "ops": {op: {"kind": k, "calls": c, "failed": 0, "bytes": b, "time_ns": t}
                    for op, (k, c, b, t) in ops.items()}}


def test_totals_count_calls_bytes_time_and_failures_per_operation() -> None:
    totals = Totals()
    totals.add_all([_record("collective", "allreduce", 100, 400, call_bytes=1024),
                    _record("collective", "allreduce", 1000, 1100, call_bytes=1024,
                            error="DistBackendError: peer gone"),
                    _record("p2p", "send", 10, 30, nbytes=800),
                    _record("rpc", "rpc_sync", 5, 50)])  # no size known: counts 0 bytes
    assert totals.ops() == {
        "allreduce": {"kind": "collective", "calls": 2, "failed": 1, "bytes": 2048,
                      "time_ns": 300 + 100},
        "send": {"kind": "p2p", "calls": 1, "failed": 0, "bytes": 800, "time_ns": 20},
        "rpc_sync": {"kind": "rpc", "calls": 1, "failed": 0, "bytes": 0, "time_ns": 45}}


def test_a_call_whose_size_is_unknown_adds_no_bytes() -> None:
    # the MPI backend's barrier and all_to_all attach calls of nbytes -1
    totals = Totals()
    totals.add_all([_record("collective", "barrier", 100, 400, call_bytes=-1),
                    _record("collective", "barrier", 500, 600, call_bytes=-1)])
    assert totals.ops() == {"barrier": {"kind": "collective", "calls": 2, "failed": 0,
                                        "bytes": 0, "time_ns": 400}}


def test_a_batch_of_mixed_records_counts_as_each_record_added_up_one_by_one() -> None:
    # interleaved operations, sizes from the caller or from the call, failures, and records
    # that never started: the expected totals are added up here record by record
    random = Random(7)
    records = []
    for i in range(300):
        op = random.choice(["allreduce", "send", "rpc_sync", "broadcast"])
        kind = {"send": "p2p", "rpc_sync": "rpc"}.get(op, "collective")
        started = 0 if i % 37 == 0 else random.randrange(1, 10**6)
        finished = max(started, 1) + random.randrange(0, 10**4)
        if kind == "p2p":
            rec = _record(kind, op, started, finished, nbytes=random.randrange(0, 4096))
        elif kind == "rpc":
            rec = _record(kind, op, started, finished)
        else:
            rec = _record(kind, op, started, finished,
                          call_bytes=None if not started else 4 * random.randrange(1, 512))
        if i % 11 == 0:
            rec.error = "DistBackendError: peer gone"
        records.append(rec)
    expected: dict[str, dict] = {}
    for rec in records:
        op = rec.op
        entry = expected.setdefault(op, {"kind": rec.kind, "calls": 0, "failed": 0,
                                         "bytes": 0, "time_ns": 0})
        entry["calls"] += 1
        entry["failed"] += 1 if rec.error else 0
        if rec.nbytes >= 0:
            entry["bytes"] += rec.nbytes
        elif rec.call is not None:
            entry["bytes"] += rec.call.nbytes
        if rec.started:
            entry["time_ns"] += round((rec.finished - rec.started) * 1e9)
    totals = Totals()
    totals.add_all(records[:150])
    totals.add_all(records[150:])
    found = totals.ops()
    assert {op: {**v, "time_ns": 0} for op, v in found.items()} == {
        op: {**v, "time_ns": 0} for op, v in expected.items()}
    for op, entry in expected.items():  # stamps are float seconds: equal to the nanosecond
        assert abs(found[op]["time_ns"] - entry["time_ns"]) <= 1, op


def _issue(recorder: FlightRecorder, op: str = "send") -> Operation:
    rec = recorder.record("p2p", "0", op, nbytes=8)
    rec.started = 10e-9
    return rec


def _finish(rec: Operation, error: str = "") -> None:
    """As an operation's path finishes its record: the error first, then the stamp."""
    rec.error = error
    rec.finished = 13e-9


def _calls(totals: Totals, op: str = "send") -> int:
    return totals.ops().get(op, {}).get("calls", 0)


def test_a_snapshot_counts_every_finished_record_once_before_and_after_its_hand_over() -> None:
    recorder = FlightRecorder(256)
    totals = Totals(recorder)
    totals.start_counting()
    first = [_issue(recorder) for _ in range(10)]  # fewer than one hand-over's worth
    for rec in first[:7]:
        _finish(rec)
    assert _calls(totals) == 7
    for rec in first[7:]:
        _finish(rec)
    assert _calls(totals) == 10
    for _ in range(COUNT_EVERY * 3 + 5):  # several hand-overs
        _finish(_issue(recorder))
    assert totals.ops()["send"] == {"kind": "p2p", "calls": 10 + COUNT_EVERY * 3 + 5,
                                    "failed": 0, "bytes": 8 * (10 + COUNT_EVERY * 3 + 5),
                                    "time_ns": 3 * (10 + COUNT_EVERY * 3 + 5)}


def test_a_record_still_running_at_its_hand_over_is_counted_when_it_finishes() -> None:
    recorder = FlightRecorder(256)
    totals = Totals(recorder)
    totals.start_counting()
    slow = _issue(recorder, "irecv")
    for _ in range(COUNT_EVERY * 2):  # handed over twice while it runs
        _finish(_issue(recorder))
    assert _calls(totals, "irecv") == 0
    _finish(slow, error="DistBackendError: peer gone")
    assert totals.ops()["irecv"]["failed"] == 1
    for _ in range(COUNT_EVERY * 2):
        _finish(_issue(recorder))
    assert _calls(totals, "irecv") == 1
    assert _calls(totals) == COUNT_EVERY * 4


def test_counts_survive_the_ring_being_reset() -> None:
    recorder = FlightRecorder(256)
    totals = Totals(recorder)
    totals.start_counting()
    for _ in range(10):
        _finish(_issue(recorder))
    recorder.configure(128)
    for _ in range(COUNT_EVERY + 1):
        _finish(_issue(recorder))
    assert _calls(totals) == 10 + COUNT_EVERY + 1


def test_totals_lose_no_count_when_threads_issue_and_finish_operations_together() -> None:
    for _ in range(3):  # each round: the threads interleave differently
        recorder = FlightRecorder(512)
        totals = Totals(recorder)
        totals.start_counting()
        start = threading.Barrier(4)

        def hammer(recorder: FlightRecorder = recorder, start: threading.Barrier = start) -> None:
            start.wait()
            running: list[list] = []
            for _ in range(5_000):
                running.append(_issue(recorder))
                if len(running) > 20:  # some finish after their hand-over
                    _finish(running.pop(0))
            for rec in running:
                _finish(rec)

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        switch = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # threads change often: some mid-way through a record
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(switch)
        assert totals.ops()["send"] == {"kind": "p2p", "calls": 20_000, "failed": 0,
                                        "bytes": 8 * 20_000, "time_ns": 3 * 20_000}


def test_totals_are_written_only_where_ringrun_asked(tmp_path: Path) -> None:
    totals = Totals()
    totals.rank = 3
    totals.add_all([_record("collective", "barrier", 1, 8, call_bytes=0)])
    with _config.override(OBSERVE_DIR=""):
        assert totals.write() is None
    with _config.override(OBSERVE_DIR=str(tmp_path)):
        path = totals.write()
    assert path == str(tmp_path / "summary-3.json")
    data = json.loads(Path(path).read_text())
    assert data["format"] == "ringtorch-rank-summary" and data["rank"] == 3
    assert data["ops"] == {"barrier": {"kind": "collective", "calls": 1, "failed": 0,
                                       "bytes": 0, "time_ns": 7}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary-3.json"]  # no temporary


def test_the_rank_that_waits_least_is_the_straggler_and_its_lag_is_the_others_median() -> None:
    ms = 1_000_000
    summaries = {
        0: _summary(0, {"allreduce": ("collective", 10, 40, 510 * ms),
                        "broadcast": ("collective", 1, 4, 9 * ms)}),
        1: _summary(1, {"allreduce": ("collective", 10, 40, 500 * ms),
                        "broadcast": ("collective", 1, 4, 1 * ms)}),
        2: _summary(2, {"allreduce": ("collective", 10, 40, 20 * ms),
                        "broadcast": ("collective", 1, 4, 5 * ms),
                        "allgather": ("collective", 3, 12, 3 * ms)}),
        3: _summary(3, {"allreduce": ("collective", 10, 40, 530 * ms),
                        "broadcast": ("collective", 1, 4, 5 * ms)}),
    }
    found = stragglers(summaries)
    # broadcast has a root (no verdict); allgather ran on one rank only (nobody to compare)
    assert [s.op for s in found] == ["allreduce"]
    (verdict,) = found
    # per call: rank 2 spent 2 ms; the others 51, 50, 53: median 51 ms; lag 49 ms
    assert (verdict.rank, verdict.own_ns, verdict.others_ns) == (2, 2 * ms, 51 * ms)
    assert verdict.lag_ns == 49 * ms and verdict.calls == 10
    text = format_summary(summaries, expected=[0, 1, 2, 3, 4])
    assert ("  allreduce: slowest rank 2: the others waited 49.0 ms per call for it (490.0 ms "
            "over 10 calls; per call it spent 2.0 ms inside, the others 51.0 ms)") in text
    assert ("  rank 2: collectives 28.0 ms (14 calls, 56 B) of 1.00 s since init") in text
    assert text.splitlines()[-1] == ("  no summary from rank 4 (it exited before initializing "
                                     "a process group, or it was killed)")


def test_no_summary_at_all_formats_to_nothing() -> None:
    assert format_summary({}, expected=[0, 1]) == ""


def test_damaged_and_foreign_files_are_named_not_fatal(tmp_path: Path) -> None:
    (tmp_path / "summary-0.json").write_text(json.dumps(_summary(0, {})))
    (tmp_path / "summary-1.json").write_text("{ half a fi")
    (tmp_path / "summary-2.json").write_text(json.dumps({"format": "something else"}))
    (tmp_path / "flight-0.json").write_text("not ours")
    found, problems = read_summaries(str(tmp_path))
    assert list(found) == [0]
    assert len(problems) == 2
    assert problems[0].startswith("summary-1.json unreadable (JSONDecodeError")
    assert problems[1] == "summary-2.json unreadable (ValueError: format 'something else')"
    text = format_summary(found, expected=[0, 1, 2], problems=problems)
    assert "  rank 0: no collective, p2p or RPC call in 1.00 s since init" in text
    assert "  summary-1.json unreadable (JSONDecodeError" in text


def test_a_missing_folder_reads_as_no_summary(tmp_path: Path) -> None:
    assert read_summaries(str(tmp_path / "never made")) == ({}, [])


def test_a_rank_that_did_not_record_says_so() -> None:
    quiet = {**_summary(0, {}), "recording": False}
    assert format_summary({0: quiet}).splitlines()[1] == (
        "  rank 0: not recorded (RINGTORCH_FLIGHT_RECORDER=0)")

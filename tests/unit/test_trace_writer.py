"""The timeline's writer, clock alignment and merge, in one process (no ranks needed).

The ranks' side is tested end to end in tests/integration/test_timeline.py; here the parts
whose behaviour is easiest to pin down alone: the bound on kept events, the clock
measurement over a real store, and which files a merge takes.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringtorch import _config
from ringtorch._observe import clock, trace_merge
from ringtorch._observe.recorder import COLLECTIVE, RECORDER
from ringtorch._observe.trace import TRACER, Clock, Tracer
from ringtorch.launcher import trace_merge as launcher_trace
from ringtorch.launcher.config import LaunchConfig
from ringtorch.store import HashStore


@pytest.fixture
def tracer(tmp_path: Path) -> Iterator[Tracer]:
    yield TRACER
    TRACER.stop()


def _finish_one(op: str) -> None:
    rec = RECORDER.record(COLLECTIVE, "0", op)
    rec.started = time.monotonic()
    RECORDER.finished(rec, None)


def test_past_the_bound_new_operations_are_counted_and_dropped(tracer: Tracer,
                                                               tmp_path: Path) -> None:
    with _config.override(TRACE_MAX_EVENTS=3):
        tracer.start(str(tmp_path), 0, 1, Clock(), "run")
    for i in range(5):
        _finish_one(f"op{i}")
    path = tracer.write()
    assert path == str(tmp_path / "trace-0.json")
    doc = json.loads(Path(path).read_text())
    info = doc["otherData"]["ranks"]["0"]
    assert (info["kept"], info["dropped"], info["max_events"]) == (3, 2, 3)
    assert info["dropped_from_us"] >= 0
    ran = [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"]
    assert ran == ["op0", "op1", "op2"]  # the beginning is kept


def test_a_bound_below_one_is_refused(tracer: Tracer, tmp_path: Path) -> None:
    with _config.override(TRACE_MAX_EVENTS=0):
        with pytest.raises(ValueError, match=r"^RINGTORCH_TRACE_MAX_EVENTS must be > 0, got 0$"):
            tracer.start(str(tmp_path), 0, 1, Clock(), "run")
    assert not tracer.on


def test_after_stop_no_operation_is_kept(tracer: Tracer, tmp_path: Path) -> None:
    tracer.start(str(tmp_path), 0, 1, Clock(), "run")
    _finish_one("kept")
    tracer.stop()
    _finish_one("not kept")
    assert [e["name"] for e in tracer.events() if e["ph"] == "X"] == ["kept"]


def test_clock_times_are_microseconds_on_rank_0s_clock_from_its_origin() -> None:
    aligned = Clock(offset_ns=5_000, error_ns=100, origin_ns=1_000_000)
    assert aligned.us(1_000_000) == 5.0
    assert aligned.us(1_002_500) == 7.5


def test_the_measured_offset_of_two_threads_is_within_its_bound_of_zero() -> None:
    store = HashStore()  # one process: one clock, so the true offset is 0
    results: dict[int, tuple[Clock, str]] = {}
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(
        r, clock.align(store, r, 3))) for r in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert {run for _, run in results.values()} == {results[0][1]}
    for rank in (1, 2):
        measured = results[rank][0]
        assert measured.rounds == clock.ROUNDS and measured.error_ns > 0
        assert abs(measured.offset_ns) <= measured.error_ns
        assert measured.origin_ns == results[0][0].origin_ns


def _rank_doc(rank: int, run_id: str) -> dict:
    other = Tracer()
    other.start("", rank, 3, Clock(error_ns=1_000 * (rank + 1)), run_id)
    other.stop()
    return other.document()


def test_a_merge_takes_this_runs_files_once_each(tmp_path: Path) -> None:
    for rank in (0, 1):
        trace_merge.write_json(_rank_doc(rank, "now"), str(tmp_path / f"trace-{rank}.json"))
    trace_merge.write_json(_rank_doc(2, "earlier"), str(tmp_path / "trace-2.json"))
    # rank 1 again inside a node's merged file: taken once
    node = trace_merge.merge([_rank_doc(1, "now")])
    trace_merge.write_json(node, str(tmp_path / "trace-node1.json"))
    (tmp_path / "trace-x.json").write_text("{}")  # not one of ours
    path, ranks = trace_merge.merge_directory(str(tmp_path), run_id="now")
    assert (path, ranks) == (str(tmp_path / "trace.json"), [0, 1])
    merged = json.loads(Path(path).read_text())
    names = [e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"]
    assert [n.split(" (")[0] for n in names] == ["rank 0", "rank 1"]
    other = merged["otherData"]
    assert other["missing_ranks"] == [2] and other["clock_error_bound_us"] == 2.0
    assert "within 2.0 us of rank 0's time" in other["alignment"]


def test_the_launcher_of_node_n_merges_into_its_own_file(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    observe, out = tmp_path / "observe", tmp_path / "out"
    observe.mkdir()
    for rank in (4, 5):
        trace_merge.write_json(_rank_doc(rank, "now"), str(observe / f"trace-{rank}.json"))
    config = LaunchConfig(argv=("job",), trace_dir=str(out))
    path = launcher_trace.merge_attempt(config, str(observe), node=2)
    assert path == str(out / "trace-node2.json")
    assert sorted(json.loads(Path(path).read_text())["otherData"]["ranks"]) == ["4", "5"]
    assert capsys.readouterr().err == f"ringrun: timeline of ranks 4, 5: {path}\n"
    assert launcher_trace.worker_env(config) == {"RINGTORCH_TRACE": str(out)}


def test_the_launcher_says_when_no_worker_wrote_a_trace(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture) -> None:
    config = LaunchConfig(argv=("job",), trace_dir=str(tmp_path / "out"))
    assert launcher_trace.merge_attempt(config, str(tmp_path), node=0) is None
    assert capsys.readouterr().err == (
        f"ringrun: no timeline: no worker wrote a trace file (into {tmp_path})\n")


def test_an_untraced_job_gives_its_workers_nothing_and_merges_nothing(tmp_path: Path) -> None:
    with _config.override(TRACE=""):
        config = LaunchConfig(argv=("job",))
        assert launcher_trace.worker_env(config) == {}
        assert launcher_trace.merge_attempt(config, str(tmp_path), node=0) is None

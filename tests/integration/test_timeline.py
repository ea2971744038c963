"""The timeline: every rank's operations as one Chrome trace, on rank 0's clock.

Real ranks (run_ranks, and ringrun subprocesses) trace real collectives, RPCs and DDP steps;
the tests read the merged ``trace.json`` as Perfetto would: against the trace event format,
then for what the ranks did (their sizes, peers and functions, written out here).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ringtorch.testing import run_ranks
from tests.integration import _trace_ranks as ranks

PHASES = {"X", "B", "E", "i", "I", "b", "e", "n", "M", "C", "s", "t", "f"}


def check_trace_format(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Assert that ``doc`` is a JSON-object trace of the trace event format; its events."""
    assert isinstance(doc, dict) and isinstance(doc["traceEvents"], list)
    json.loads(json.dumps(doc))  # plain JSON data
    events = doc["traceEvents"]
    open_async: dict[tuple[Any, ...], int] = {}
    for e in events:
        assert e["ph"] in PHASES, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert isinstance(e["ts"], (int, float)) and isinstance(e["name"], str), e
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name"), e
        if e["ph"] in ("b", "e"):
            key = (e["pid"], e["cat"], e["name"], e["id"])
            open_async[key] = open_async.get(key, 0) + (1 if e["ph"] == "b" else -1)
    assert all(count == 0 for count in open_async.values()), "unmatched async begin/end"
    return events


def by_rank(events: list[dict[str, Any]], ph: str) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e["ph"] == ph:
            out.setdefault(e["pid"], []).append(e)
    return out


def async_spans(events: list[dict[str, Any]], pid: int) -> list[tuple[str, float, float, dict]]:
    """(name, begin, end, args) of every async slice of process ``pid``."""
    begins = {(e["cat"], e["name"], e["id"]): e for e in events
              if e["ph"] == "b" and e["pid"] == pid}
    return [(e["name"], begins[key]["ts"], e["ts"], begins[key]["args"]) for e in events
            if e["ph"] == "e" and e["pid"] == pid
            and (key := (e["cat"], e["name"], e["id"])) in begins]


def test_the_merged_trace_has_one_process_per_rank_with_each_operation_and_its_sizes(
        tmp_path: Path) -> None:
    results = run_ranks(ranks.operations, 2, env={"RINGTORCH_TRACE": str(tmp_path)})
    merged = tmp_path / "trace.json"
    assert results[0]["merged"] == str(merged)
    doc = json.loads(merged.read_text())
    events = check_trace_format(doc)
    host = socket.gethostname()
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {0: f"rank 0 ({host})", 1: f"rank 1 ({host})"}
    complete = by_rank(events, "X")
    for rank in (0, 1):
        reduces = [e for e in complete[rank] if e["name"] == "allreduce"]
        assert [e["args"]["nbytes"] for e in reduces] == [1024, 4096]
        assert [e["args"]["seq"] for e in reduces] == [0, 1]
        assert all(e["args"]["dtype"] == "float32" and e["args"]["redop"] == "SUM"
                   for e in reduces)
        (bcast,) = [e for e in complete[rank] if e["name"] == "broadcast"]
        assert bcast["args"]["nbytes"] == 24 and bcast["args"]["root"] == 0
        p2p = {e["name"]: e for e in complete[rank] if e["cat"] == "p2p"}
        assert list(p2p) == (["send to 1"] if rank == 0 else ["recv from 0"])
        assert next(iter(p2p.values()))["args"]["nbytes"] == 20
        (mine,) = [e for e in complete[rank] if e["name"] == "my step"]
        assert mine["args"] == {"step": 1}
        # every operation's queued phase, and it ends where its running phase begins
        queued = {name.rsplit(" queued", 1)[0]: (begin, end)
                  for name, begin, end, _ in async_spans(events, rank) if name.endswith("queued")}
        assert {"allreduce #0", "allreduce #1", "broadcast #2", "barrier #3"} <= set(queued)
        assert queued["allreduce #1"][1] == pytest.approx(reduces[1]["ts"])
        threads = {e["tid"] for e in events if e["name"] == "thread_name" and e["pid"] == rank}
        assert {e["tid"] for e in complete[rank]} <= threads


def test_each_ranks_clock_offset_is_recorded_with_its_error_bound(tmp_path: Path) -> None:
    run_ranks(ranks.operations, 2, env={"RINGTORCH_TRACE": str(tmp_path)})
    other = json.loads((tmp_path / "trace.json").read_text())["otherData"]
    assert other["world_size"] == 2 and other["missing_ranks"] == []
    clocks = {int(r): info["clock"] for r, info in other["ranks"].items()}
    assert clocks[0]["offset_ns"] == 0 and clocks[0]["error_bound_ns"] == 0
    assert clocks[1]["rounds"] == 8 and clocks[1]["error_bound_ns"] > 0
    # one host: both ranks read the same CLOCK_MONOTONIC, so the true offset is 0, and the
    # measured one must be within its stated bound of it
    assert abs(clocks[1]["offset_ns"]) <= clocks[1]["error_bound_ns"]
    assert other["clock_error_bound_us"] == clocks[1]["error_bound_ns"] / 1000.0
    assert clocks[0]["origin_unix_ns"] == clocks[1]["origin_unix_ns"] > 0


def test_an_rpc_shows_on_the_caller_and_on_the_callee(tmp_path: Path) -> None:
    merged, _ = run_ranks(ranks.rpc_call, 2, env={"RINGTORCH_TRACE": str(tmp_path)})
    events = check_trace_format(json.loads(Path(merged).read_text()))
    function = f"{ranks.__name__}.square"
    (call,) = [s for s in async_spans(events, 0) if s[3].get("detail") == function]
    assert call[0] == f"rpc_sync {function} -> worker1"
    (served,) = [e for e in by_rank(events, "X")[1] if e["cat"] == "rpc"]
    assert served["name"] == f"serve {function} <- worker0"
    assert served["args"]["caller"] == "worker0"
    bound = json.loads(Path(merged).read_text())["otherData"]["clock_error_bound_us"]
    # on rank 0's clock the callee served the call while the caller waited for it
    assert call[1] - bound <= served["ts"]
    assert served["ts"] + served["dur"] <= call[2] + bound


def test_a_ddp_step_shows_its_buckets_reduced_while_backward_runs(tmp_path: Path) -> None:
    buckets, _ = run_ranks(ranks.ddp_step, 2, env={"RINGTORCH_TRACE": str(tmp_path)})
    assert buckets >= 3
    events = check_trace_format(json.loads((tmp_path / "trace.json").read_text()))
    for rank in (0, 1):
        backwards = [e for e in by_rank(events, "X")[rank] if e["name"] == "backward"]
        assert len(backwards) == 2  # two steps
        spans = [s for s in async_spans(events, rank) if s[0].endswith(" all_reduce")]
        assert sorted({s[3]["bucket"] for s in spans}) == list(range(buckets))
        ready = [e for e in by_rank(events, "i")[rank] if e["name"].endswith(" ready")]
        assert len(ready) == 2 * buckets
        for step in backwards:
            end = step["ts"] + step["dur"]
            inside = [s for s in spans if step["ts"] <= s[1] <= end]
            # bucket 0 was launched while backward still ran and, like every bucket of the
            # step, completed after it had been launched
            assert any(s[3]["bucket"] == 0 and s[1] < end for s in inside)
            assert all(s[2] >= s[1] for s in inside)
        finalize = [e for e in by_rank(events, "X")[rank] if e["name"] == "finalize"]
        assert len(finalize) == 2


SCRIPT = r"""
import torch
import ringtorch.distributed as dist
from ringtorch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
dist.all_reduce(torch.ones(8))
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)),
            bucket_cap_mb=0.01)
model(torch.randn(4, 64)).sum().backward()
dist.destroy_process_group()
"""


def test_ringrun_trace_writes_one_timeline_of_every_rank(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    out = tmp_path / "timeline"
    env = {**os.environ, "RINGTORCH_TRACE_MERGE_WAIT_S": "0"}
    env.pop("RINGTORCH_TRACE", None)
    result = subprocess.run([sys.executable, "-m", "ringtorch.launcher", "--nproc-per-node", "3",
                             "--trace", str(out), str(script)], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"ringrun: timeline of ranks 0-2: {out / 'trace.json'}" in result.stderr
    assert sorted(os.listdir(out)) == ["trace.json"]  # the ranks' files stay in the run's folder
    doc = json.loads((out / "trace.json").read_text())
    events = check_trace_format(doc)
    assert {e["pid"] for e in events} == {0, 1, 2}
    for rank in range(3):
        complete = by_rank(events, "X")[rank]
        assert [e["args"]["nbytes"] for e in complete if e["name"] == "allreduce"][0] == 32
        assert any(e["name"] == "backward" for e in complete)
    assert doc["otherData"]["missing_ranks"] == []


def test_the_merge_command_joins_the_rank_files_of_a_folder(tmp_path: Path) -> None:
    run_ranks(ranks.operations, 2, env={"RINGTORCH_TRACE": str(tmp_path)})
    first = json.loads((tmp_path / "trace.json").read_text())
    (tmp_path / "trace.json").unlink()
    out = tmp_path / "again.json"
    result = subprocess.run([sys.executable, "-m", "ringtorch.distributed.trace", str(tmp_path),
                             "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{out}: ranks [0, 1]\n"
    assert json.loads(out.read_text()) == first


def test_the_merge_command_says_when_a_folder_has_no_trace_files(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "ringtorch.distributed.trace", str(tmp_path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == f"no trace-<rank>.json files in {tmp_path}\n"


MPI_SCRIPT = r"""
import torch
import ringtorch.distributed as dist

dist.init_process_group("mpi")
dist.all_reduce(torch.ones(16))
dist.destroy_process_group()
"""


def test_under_mpirun_the_ranks_share_no_store_and_the_trace_says_they_are_unaligned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.integration._mpi_jobs import mpirun
    from tests.integration._mpi_jobs import run as run_mpi

    script = tmp_path / "job.py"
    script.write_text(MPI_SCRIPT)
    monkeypatch.setenv("RINGTORCH_TRACE", str(tmp_path / "tl"))
    done = run_mpi([*mpirun(), "-n", "2", sys.executable, str(script)], timeout=90)
    assert done.returncode == 0, done.stdout[-4000:]
    doc = json.loads((tmp_path / "tl" / "trace.json").read_text())
    events = check_trace_format(doc)
    for rank in (0, 1):
        (reduce,) = [e for e in by_rank(events, "X")[rank] if e["name"] == "allreduce"]
        assert (reduce["args"]["group"], reduce["args"]["seq"]) == ("0", 0)
    other = doc["otherData"]
    assert other["clock_error_bound_us"] is None and other["missing_ranks"] == []
    assert other["alignment"].startswith("the ranks shared no store (MPI backend)")
    assert {info["clock"]["error_bound_ns"] for info in other["ranks"].values()} == {-1}

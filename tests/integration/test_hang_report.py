"""The cross-rank hang report names the rank everybody waits for and what it is doing.

Each test makes one kind of hang with real processes (tests/integration/_hang_ranks.py): a
rank that skips a collective, one stuck in time.sleep, one spinning in a Python loop, one that
calls another collective, one waiting on an RPC; without a launcher (the rank that times out
makes the report; ``python -m ringtorch.distributed.debug host:port``) and under ringrun
(SIGUSR1 through the debug command, then SIGTERM). The expected rank, operation and line come
from the rank code itself, never from the report's code.
"""

from __future__ import annotations

import inspect
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from ringtorch.testing import run_ranks, wait_for
from ringtorch.testing.harness import job_port
from tests.integration import _hang_ranks as ranks

RANKS_FILE = ranks.__file__


def _line(function: object, marker: str) -> int:
    """The line of ``function`` holding ``marker`` (so no test hard-codes a number)."""
    lines, first = inspect.getsourcelines(function)  # type: ignore[arg-type]
    return first + next(i for i, text in enumerate(lines) if marker in text)


def _report_of(errors: list[str]) -> str:
    """The report the non-culprit ranks' errors name (one report for the whole group)."""
    paths = {m.group(1) for e in errors for m in [re.search(r"\(hang report: (.*)\)$", e)] if m}
    assert len(paths) == 1, errors
    path = paths.pop()
    try:
        return Path(path).read_text()
    finally:
        os.unlink(path)


def _frame(function: object, marker: str) -> str:
    name = function.__name__  # type: ignore[attr-defined]
    return f'File "{RANKS_FILE}", line {_line(function, marker)} in {name}'


def _run_hang(fn: object, world_size: int, culprit: int) -> tuple[list[str], str]:
    results = run_ranks(fn, world_size, args=(culprit,), timeout=60)  # type: ignore[arg-type]
    errors = [r for rank, r in enumerate(results) if rank != culprit]
    return results, _report_of(errors)


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_rank_that_skips_a_collective_is_the_one_everybody_waits_for(world_size: int) -> None:
    culprit = world_size - 1
    results, report = _run_hang(ranks.skips_a_collective, world_size, culprit)
    assert results[culprit] == "skipped"
    for rank, error in enumerate(results):
        if rank != culprit:
            assert "timed out after 0:00:03" in error, error
    assert f"everybody waits for: ranks [{culprit}]\n" in report, report
    assert (f"first divergence: allreduce #1 (256 bytes, float32): ranks [{culprit}] did not "
            f"arrive") in report, report
    assert re.search(rf"rank {culprit}: done with allreduce #0 \(256 bytes, float32\) at "
                     rf"{re.escape(RANKS_FILE)}:\d+; not in a collective", report), report
    assert f"rank {culprit} is doing:" in report
    assert _frame(ranks.skips_a_collective, "HANG.store.wait") in report, report


def test_a_rank_stuck_in_time_sleep_is_named_with_its_sleeping_line() -> None:
    results, report = _run_hang(ranks.stuck_in_sleep, 3, 1)
    assert results[1] == "slept"
    assert "everybody waits for: ranks [1]\n" in report, report
    assert "ranks [0, 2] are waiting in it" in report, report
    assert _frame(ranks.stuck_in_sleep, "time.sleep(0.2)") in report, report


def test_a_rank_stuck_in_a_python_loop_is_named_with_its_loop() -> None:
    results, report = _run_hang(ranks.stuck_in_python_loop, 2, 0)
    assert results[0] == "spun"
    assert "everybody waits for: ranks [0]\n" in report, report
    loop = [_frame(ranks.stuck_in_python_loop, marker)
            for marker in ("while spins % 200_000", "spins += 1")]
    assert loop[0] in report or loop[1] in report, report


def test_a_rank_holding_the_gil_in_c_gives_its_stacks_by_signal(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    results: list[object] = []
    job = threading.Thread(target=lambda: results.extend(run_ranks(
        ranks.holds_the_gil_in_c, 3, args=(2, str(fifo)), timeout=60,
        env={"RINGTORCH_OBSERVE_DIR": str(tmp_path)})))
    job.start()
    try:
        wait_for(lambda: list(tmp_path.glob("hang-report-*.txt")), 40, "a hang report")
    finally:
        with open(fifo, "wb") as f:
            f.write(b"x")
        job.join(60)
    assert results[2] == "held"
    (copy,) = tmp_path.glob("hang-report-*.txt")  # beside the ranks' files, as under ringrun
    report = _report_of([r for r in results[:2]])  # type: ignore[misc]
    assert copy.read_text() == report
    copy.unlink()
    # the report was begun ahead of the 3 s timeout: it waited what was left before it
    assert re.search(r"rank 2: did not answer within [\d.]+ s; stacks by SIGUSR1\n", report), report
    assert "everybody waits for: ranks [2]\n" in report, report
    assert _frame(ranks.holds_the_gil_in_c, "ctypes.PyDLL(None).read") in report, report


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_rank_that_calls_another_collective_is_reported_as_a_mismatch(world_size: int) -> None:
    culprit = world_size - 1
    results = run_ranks(ranks.calls_another_collective, world_size, args=(culprit,), timeout=60)
    report = _report_of(results)
    others = "; ".join(f"rank {r} called allreduce #1 (256 bytes, float32) at {RANKS_FILE}:"
                       f"{_line(ranks._others, 'dist.all_reduce')}" for r in range(culprit))
    mine = (f"rank {culprit} called broadcast #1 (256 bytes, float32, root 0) at {RANKS_FILE}:"
            f"{_line(ranks.calls_another_collective, 'dist.broadcast')}")
    assert f"MISMATCH on group '0' at #1: {others}; {mine}\n" in report, report


def test_the_debug_command_names_the_callee_a_rank_waits_for_over_rpc(tmp_path: Path) -> None:
    port = job_port()
    ready, done = tmp_path / "ready", tmp_path / "done"
    results: list[object] = []
    job = threading.Thread(target=lambda: results.extend(run_ranks(
        ranks.waits_on_rpc, 2, args=(str(ready), str(done)), env={"MASTER_PORT": str(port)},
        timeout=60)))
    job.start()
    try:
        wait_for(ready.exists, 30, str(ready))
        out = subprocess.run([sys.executable, "-m", "ringtorch.distributed.debug",
                              f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)
    finally:
        done.touch()
        job.join(60)
    assert out.returncode == 0, out.stderr
    assert results == [7, -1]
    assert re.search(r"rank 0 waits for rpc_sync to worker1 \(rank 1\) \(\S*slow_callee\) at "
                     + re.escape(f"{RANKS_FILE}:{_line(ranks.waits_on_rpc, 'rpc.rpc_sync')}"),
                     out.stdout), out.stdout
    assert "everybody waits for: ranks [1]\n" in out.stdout
    assert _frame(ranks.slow_callee, "time.sleep(0.05)") in out.stdout, out.stdout
    saved = re.search(r"^\(saved in (.*)\)$", out.stdout, re.M)
    assert saved is not None
    os.unlink(saved.group(1))


def test_the_debug_command_refuses_a_process_that_is_not_a_launcher() -> None:
    out = subprocess.run([sys.executable, "-m", "ringtorch.distributed.debug", str(os.getpid())],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert re.match(rf"^ringtorch.distributed.debug: process {os.getpid()} is not a ringrun "
                    rf"launcher \(.*\); give the launcher's pid, its run directory or the "
                    rf"store's host:port\n$", out.stderr), out.stderr


LATE_JOB = r"""
import os, time
from datetime import timedelta
import torch
import ringtorch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank = dist.get_rank()
dist.all_reduce(torch.ones(4))
open(os.path.join(os.environ["OUT_DIR"], "ready%d" % rank), "w").close()
if rank == 1:
    time.sleep(600)  # the late rank
dist.all_reduce(torch.ones(1000))
"""


def test_ringrun_reports_on_sigusr1_from_the_debug_command_and_again_on_sigterm(
        tmp_path: Path) -> None:
    script = tmp_path / "late.py"
    script.write_text(LATE_JOB)
    logs = tmp_path / "logs"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ringtorch.distributed.run", "--nproc-per-node", "3",
         "--log-dir", str(logs), str(script)],
        env={**os.environ, "OUT_DIR": str(tmp_path)}, stderr=subprocess.PIPE, text=True)
    try:
        for rank in range(3):
            wait_for((tmp_path / f"ready{rank}").exists, 60, f"rank {rank}'s ready marker")
        (run_dir,) = logs.iterdir()
        asked = subprocess.run([sys.executable, "-m", "ringtorch.distributed.debug",
                                str(run_dir)], capture_output=True, text=True, timeout=60)
        launcher.send_signal(signal.SIGTERM)
        _, stderr = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert asked.returncode == 0, asked.stderr
    line = LATE_JOB.splitlines().index("    time.sleep(600)  # the late rank")
    for report in (asked.stdout, stderr.split("why: ringrun received SIGTERM")[1]):
        assert "everybody waits for: ranks [1]\n" in report, report
        assert ("first divergence: allreduce #1 (4000 bytes, float32): ranks [1] did not "
                "arrive; ranks [0, 2] are waiting in it") in report, report
        assert f'File "{script}", line {line + 1} in <module>' in report, report
    assert "why: ringrun received SIGUSR1" in asked.stdout
    assert "ringrun: received SIGTERM: stopped 3 running worker(s)" in stderr
    saved = sorted(p.name for p in run_dir.glob("hang-report-ringrun-*.txt"))
    assert len(saved) == 2, saved
    observe = run_dir / "attempt_0" / "observe"
    assert sorted(p.name for p in observe.glob("flight-*.json")) == [
        "flight-0.json", "flight-1.json", "flight-2.json"]
    for path in Path(tempfile.gettempdir()).glob(f"hang-report-ringrun-*-{launcher.pid}.txt"):
        path.unlink()


def test_with_hang_reports_off_a_timeout_names_no_report_and_no_responder_runs(
        tmp_path: Path) -> None:
    results = run_ranks(ranks.with_reports_off, 2, args=(str(tmp_path / "marker"),),
                        env={"RINGTORCH_HANG_REPORT": "0"}, timeout=60)
    error, _ = results[0]
    assert "timed out after 0:00:03" in error and "hang report" not in error, error
    for _, threads in results:
        assert "ringtorch-hang-responder" not in threads, threads


FAILING_JOB = r"""
import time
from datetime import timedelta
import torch
import ringtorch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=3))
dist.all_reduce(torch.ones(4))
if dist.get_rank() == 1:
    time.sleep(600)  # the late rank
dist.all_reduce(torch.ones(1000))
"""


def test_a_failed_collectives_report_is_whole_when_ringrun_has_stopped_the_job(
        tmp_path: Path) -> None:
    # The ranks that time out end the job with their errors; the report their errors name
    # must be whole (it is made before any of them raises).
    script = tmp_path / "failing.py"
    script.write_text(FAILING_JOB)
    done = subprocess.run(
        [sys.executable, "-m", "ringtorch.distributed.run", "--nproc-per-node", "3",
         str(script)], env={**os.environ, "TMPDIR": str(tmp_path)}, capture_output=True,
        text=True, timeout=120)
    assert done.returncode != 0, done.stderr
    paths = set(re.findall(r"\(hang report: (\S+)\)", done.stderr))
    assert len(paths) == 1, done.stderr
    report = Path(paths.pop()).read_text()
    line = FAILING_JOB.splitlines().index("    time.sleep(600)  # the late rank")
    assert "everybody waits for: ranks [1]\n" in report, report
    assert f'File "{script}", line {line + 1} in <module>' in report, report

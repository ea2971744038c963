"""ringrun --on-worker-failure=continue: a killed worker stops no other; the others shrink the
job (docs/recovery.md), finish, and the job succeeds, naming the worker it lost."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RINGRUN = Path(sys.executable).parent / "ringrun"
JOB = ROOT / "tests" / "integration" / "_keep_going_job.py"


def test_the_others_finish_the_job_when_a_worker_is_killed() -> None:
    run = subprocess.run([str(RINGRUN), "--nproc-per-node", "3", "--on-worker-failure",
                          "continue", "--no-summary", str(JOB)],
                         capture_output=True, text=True, timeout=150, cwd=ROOT)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    # three steps at world 3 (1 + 10 + 100), then three at world 2 (ranks 0 and 1: 1 + 10)
    for worker in (0, 1):
        assert (f"worker {worker}: now rank {worker} of 2, sums [111, 111, 111, 11, 11, 11]"
                in out), out
    assert "worker 2:" not in out
    assert "; the other 2 running worker(s) go on (--on-worker-failure=continue)" in out, out
    assert ("the job finished without the worker(s) of rank(s) [2], which failed on the way; "
            "the others exited 0") in out, out


def test_by_default_a_killed_worker_still_stops_the_others() -> None:
    run = subprocess.run([str(RINGRUN), "--nproc-per-node", "3", "--no-summary", str(JOB)],
                         capture_output=True, text=True, timeout=150, cwd=ROOT)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out
    assert "now rank" not in out, out

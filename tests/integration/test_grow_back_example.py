"""examples/grow_back.py under real ringrun: a worker SIGKILLed mid-training, the survivors
shrink and go on, ringrun restarts it alone, it joins the running job and the world is whole
again; training finishes with every rank's parameters equal and the loss down
(docs/recovery.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RINGRUN = Path(sys.executable).parent / "ringrun"


def test_a_killed_worker_is_restarted_alone_and_joins_the_running_job() -> None:
    run = subprocess.run(
        [str(RINGRUN), "--nproc-per-node", "3", "--on-worker-failure", "continue",
         "--max-restarts", "1", "--no-summary", str(ROOT / "examples" / "grow_back.py"),
         "--victim", "1", "--kill-at", "5", "--steps", "30", "--step-s", "0.05"],
        capture_output=True, text=True, timeout=170, cwd=ROOT)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert ("ringrun: rank 1 (local rank 1) failed with signal SIGKILL; restarting it alone "
            "(restart 1 of 1): it joins the running job, the others go on "
            "(--on-worker-failure=continue)") in out, out
    for rank in (0, 1):  # the survivors, renumbered at world 2
        assert f"[rank {rank} of 2] shrunk: lost rank(s) [1]; resuming at step 5" in out, out
    joined = re.search(r"\[rank 1 of 3\] joined the running job at step (\d+) \(it was at "
                       r"world 2\)", out)
    assert joined, out
    for rank in (0, 2):  # the survivors are back at their launcher's ranks
        assert f"[rank {rank} of 3] admitted rank(s) [1] at step {joined[1]}" in out, out
    assert re.search(r"\[rank 1\] world whole again \(3 ranks\): [\d.]+ s after", out), out
    done = re.search(r"finished (\d+) steps at world 3 \(started at 3\); parameters identical "
                     r"on all 3 ranks: True; loss ([\d.]+) -> ([\d.]+)", out)
    assert done and int(done[1]) >= 30, out
    assert float(done[3]) < float(done[2]) / 10, out  # the model learned
    assert ("ringrun: the job finished; worker(s) restarted alone on the way: rank 1 "
            "(restart 1 of 1)") in out, out
    assert "without the worker(s)" not in out, out

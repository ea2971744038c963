"""Under ringrun --on-worker-failure=continue the launcher's agent serves the workers' store, so
the job survives the loss of rank 0 too: the survivors shrink, finish training with equal
parameters, and ringrun names the worker it lost (docs/recovery.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RINGRUN = Path(sys.executable).parent / "ringrun"


def test_the_job_survives_rank_0_sigkilled_mid_training() -> None:
    run = subprocess.run(
        [str(RINGRUN), "--nproc-per-node", "3", "--on-worker-failure", "continue", "--no-summary",
         str(ROOT / "examples" / "grow_back.py"), "--victim", "0", "--kill-at", "5", "--steps",
         "15", "--step-s", "0", "--finish-short"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert ("ringrun: rank 0 (local rank 0) failed with signal SIGKILL; the other 2 running "
            "worker(s) go on (--on-worker-failure=continue)") in out, out
    for rank in (0, 1):  # launcher ranks 1 and 2, renumbered at world 2
        assert f"[rank {rank} of 2] shrunk: lost rank(s) [0]; resuming at step 5" in out, out
    done = re.search(r"finished 15 steps at world 2 \(started at 3\); parameters identical on "
                     r"all 2 ranks: (\w+); loss ([\d.]+) -> ([\d.]+)", out)
    assert done and done[1] == "True", out
    assert float(done[3]) < float(done[2]), out  # training went on from memory, not afresh
    assert ("ringrun: the job finished without the worker(s) of rank(s) [0], which failed on the "
            "way; the others exited 0") in out, out


def test_a_replacement_for_rank_0_gets_the_survivors_state_not_a_fresh_one() -> None:
    """With --max-restarts, rank 0's replacement is rank 0 of the grown world: the state comes
    from GrownWorld.state_source (a survivor), so training goes on where the survivors were."""
    run = subprocess.run(
        [str(RINGRUN), "--nproc-per-node", "3", "--on-worker-failure", "continue",
         "--max-restarts", "1", "--no-summary", str(ROOT / "examples" / "grow_back.py"),
         "--victim", "0", "--kill-at", "5", "--steps", "30", "--step-s", "0.05"],
        capture_output=True, text=True, timeout=110, cwd=ROOT)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    joined = re.search(r"\[rank 0 of 3\] joined the running job at step (\d+) \(it was at "
                       r"world 2\)", out)
    assert joined and int(joined[1]) >= 5, out  # the survivors' step count, not 0
    first = re.search(r"step   1  world 3  loss ([\d.]+)", out)  # the job's first step
    done = re.search(r"finished \d+ steps at world 3 \(started at 3\); parameters identical on "
                     r"all 3 ranks: (\w+); loss ([\d.]+) -> ([\d.]+)", out)
    assert first and done and done[1] == "True", out
    # rank 0's first step after joining starts from the survivors' trained parameters
    assert float(done[2]) < float(first[1]) / 2, out

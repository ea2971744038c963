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

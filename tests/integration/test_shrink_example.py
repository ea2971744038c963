"""examples/shrink_on_failure.py: 4 ranks train, rank 0 (the one DDP broadcasts from) is
SIGKILLed, the other 3 shrink the world and finish training from memory with a falling loss."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEP = re.compile(r"^step +(\d+)  world (\d)  loss ([\d.]+)$", re.MULTILINE)


def test_three_of_four_ranks_finish_training_after_one_is_killed() -> None:
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "shrink_on_failure.py"),
                          "--victim", "0", "--kill-at", "10", "--steps", "30"],
                         capture_output=True, text=True, timeout=150, cwd=ROOT)
    out = run.stdout
    assert run.returncode == 0, out + run.stderr
    assert "launcher: SIGKILLed rank 0" in out
    for old_rank in (1, 2, 3):
        # each survivor's error names rank 0: its own PeerLostError, or, when another survivor
        # noticed first and aborted the group to shrink it, that survivor's abort, which says why
        assert re.search(rf"^\[rank {old_rank} of 4\] step 10: (PeerLostError: .*rank 0 |"
                         rf"\w+Error: .* rank [123] aborted the group: it shrinks the group "
                         rf"after: .*rank 0 )", out, re.MULTILINE), out
        assert re.search(rf"^\[rank {old_rank - 1} of 3\] shrunk: lost ranks \[0\], was rank "
                         rf"{old_rank} of 4; resuming at step 10$", out, re.MULTILINE), out
    steps = [(int(s), int(w), float(loss)) for s, w, loss in STEP.findall(out)]
    assert [(s, w) for s, w, _ in steps] == [(1, 4), (10, 4), (20, 3), (30, 3)], out
    assert steps[0][2] > steps[1][2] > steps[3][2], out  # the loss keeps falling after the kill
    assert "finished 30 steps at world 3; parameters identical on all 3 ranks: True" in out
    assert re.search(r"^launcher: the survivors completed a step at world 3 [\d.]+ s after the "
                     r"kill$", out, re.MULTILINE), out
    assert "launcher: exit codes {'rank0': -9, 'rank1': 0, 'rank2': 0, 'rank3': 0}" in out

"""The README's main job: examples/train.py under the real ringrun, 2 ranks, one short epoch each run.

The first run trains one epoch and writes a checkpoint; the second resumes from it for a second
epoch. Both must exit 0; accuracy after one epoch must be far above chance (10 % for 10 digits).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
RINGRUN = Path(sys.executable).parent / "ringrun"
EPOCH_LINE = re.compile(r"^epoch (\d+)/(\d+): train loss [\d.]+ acc [\d.]+% \| "
                        r"test loss [\d.]+ acc ([\d.]+)%$", re.MULTILINE)


def _ringrun(*args: object) -> subprocess.CompletedProcess[str]:
    command = [str(RINGRUN), "--nproc-per-node", "2", str(ROOT / "examples" / "train.py"),
               *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=100, cwd=ROOT)


def test_two_ranks_train_checkpoint_and_resume(tmp_path):
    checkpoint = tmp_path / "digits.pt"
    first = _ringrun("--epochs", "1", "--checkpoint", checkpoint)
    assert first.returncode == 0, first.stdout + first.stderr
    epochs = EPOCH_LINE.findall(first.stdout)
    assert [e[:2] for e in epochs] == [("1", "1")], first.stdout
    assert float(epochs[0][2]) > 30.0, first.stdout
    assert torch.load(checkpoint)["epoch"] == 0

    second = _ringrun("--epochs", "2", "--resume", "--checkpoint", checkpoint)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resuming from {checkpoint} at epoch 2" in second.stdout
    assert [e[:2] for e in EPOCH_LINE.findall(second.stdout)] == [("2", "2")], second.stdout
    assert torch.load(checkpoint)["epoch"] == 1
    assert second.stdout.count("final test accuracy") == 1  # rank 0 reports, rank 1 does not

"""``bench/gpu.py --dry`` (what the GPU check's dry run calls) runs both libraries end to end
on a CPU machine and prints its table; the numbers of such a run mean nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_bench_dry_run_times_both_libraries_at_the_tiny_sizes() -> None:
    env = dict(os.environ, RINGTORCH_DEVICE_RUNTIME="sim")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--quick"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "the simulated runtime (ringtorch) and CPU tensors (gloo)" in lines[0]
    assert lines[1].split() == ["size", "ringtorch", "us", "GB/s", "gloo", "us", "GB/s", "ratio"]
    rows = [line.split() for line in lines[2:4]]
    assert [row[0] for row in rows] == ["1K", "64K"]
    for row in rows:
        ours, theirs, ratio = float(row[1]), float(row[3]), float(row[5])
        assert ours > 0 and theirs > 0
        assert abs(ratio - ours / theirs) <= 0.01 + 0.01 * ratio

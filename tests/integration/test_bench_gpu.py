"""``bench/gpu.py --dry`` (what the GPU check's dry run calls) runs every path end to end
on a CPU machine and prints its table; the numbers of such a run mean nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_bench_dry_run_times_every_path_at_the_tiny_sizes() -> None:
    env = dict(os.environ, RINGTORCH_DEVICE_RUNTIME="sim")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--quick"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # each path's medians as its world ends (a check cut short keeps them), then the table
    assert [line.split(":")[0] for line in lines[:3]] == ["ipc", "staging", "gloo"], lines
    assert "the simulated runtime (ringtorch) and CPU tensors (gloo)" in lines[3]
    assert lines[4].split() == ["size", "ipc", "us", "GB/s", "staging", "us", "GB/s", "gloo",
                                "us", "GB/s", "ipc", "x", "staging", "x"]
    rows = [line.split() for line in lines[5:7]]
    assert [row[0] for row in rows] == ["1K", "64K"]
    for row in rows:
        ipc, staging, gloo = float(row[1]), float(row[3]), float(row[5])
        assert ipc > 0 and staging > 0 and gloo > 0
        for ratio, path in ((float(row[7]), ipc), (float(row[8]), staging)):
            assert abs(ratio - gloo / path) <= 0.01 + 0.01 * ratio

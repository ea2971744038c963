"""examples/rpc_parameter_server.py under the real ringrun: a parameter server and two trainers.

The trainers' loss must fall by orders of magnitude and the server's weights must end near the
true ones: the gradients of both trainers reached the server every step, and the server's
answers reached both trainers.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RINGRUN = Path(sys.executable).parent / "ringrun"
TRAINER = re.compile(r"^trainer(\d): loss ([\d.]+) -> ([\d.]+) after 20 steps$", re.MULTILINE)
SERVER = re.compile(r"^ps: 20 steps, max weight error ([\d.]+), bias ([\d.]+) \(true 0\.5\)$",
                    re.MULTILINE)


def test_parameter_server_example_trains_under_ringrun() -> None:
    command = [str(RINGRUN), "--nproc-per-node", "3",
               str(ROOT / "examples" / "rpc_parameter_server.py"), "--steps", "20"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    trainers = {int(r): (float(a), float(b)) for r, a, b in TRAINER.findall(done.stdout)}
    assert sorted(trainers) == [1, 2], done.stdout + done.stderr
    for first, last in trainers.values():
        assert last < first / 100, done.stdout
    (error, bias), = SERVER.findall(done.stdout)
    assert float(error) < 0.05 and abs(float(bias) - 0.5) < 0.05, done.stdout

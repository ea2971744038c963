"""Twenty restarts in a row: every attempt of the job makes its group anew and trains.

A worker that fails makes the launcher stop the others and start the whole group again
(``--max-restarts``); a restarted group must meet on the same store without reading the
previous attempt's addresses (torch's own launcher on gloo passes 2 runs of 8 here: its
issues 135712 and 167288). Each attempt below initialises its group, checks an all_reduce
against the sum computed here, writes a marker, and rank 1 fails until the 21st attempt.
Under ringrun on ringtorch's native backend, and under torch's own torchrun with the backend
"ringtorch" registered by installing ringtorch (no ringtorch import in the program).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# long (21 attempts of a 2-rank job under each launcher: about a minute each): slow stage
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

RESTARTS = 20

ATTEMPT = r"""
import os, sys, torch
{imports}
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group({backend!r})
t = torch.full((4,), float(rank + 1 + attempt))
dist.all_reduce(t)
want = sum(r + 1 + attempt for r in range(world))
assert t.tolist() == [float(want)] * 4, (t.tolist(), want)
open(os.path.join(os.environ["OUT_DIR"], f"attempt{{attempt}}-rank{{rank}}"), "w").close()
dist.destroy_process_group()
if rank == 1 and attempt < {restarts}:
    sys.exit(3)
"""


def _run(launcher: list[str], program: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "attempt.py"
    script.write_text(program)
    out = tmp_path / "out"
    out.mkdir()
    return subprocess.run([sys.executable, "-m", *launcher, "--nproc-per-node", "2",
                           "--max-restarts", str(RESTARTS), str(script)],
                          env={**os.environ, "OUT_DIR": str(out)}, capture_output=True,
                          text=True, timeout=380)


def _attempts(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "out").iterdir())


def _every_attempt() -> list[str]:
    return sorted(f"attempt{a}-rank{r}" for a in range(RESTARTS + 1) for r in range(2))


def test_twenty_restarts_in_a_row_under_ringrun(tmp_path: Path) -> None:
    program = ATTEMPT.format(imports="import ringtorch.distributed as dist", backend="gloo",
                             restarts=RESTARTS)
    done = _run(["ringtorch.launcher"], program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _attempts(tmp_path) == _every_attempt()
    assert f"restart {RESTARTS} of {RESTARTS}" in done.stderr


def test_twenty_restarts_in_a_row_under_torchrun_on_backend_ringtorch(tmp_path: Path) -> None:
    program = ATTEMPT.format(imports="import torch.distributed as dist", backend="ringtorch",
                             restarts=RESTARTS)
    done = _run(["torch.distributed.run", "--standalone", "--monitor-interval", "0.1"],
                program, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _attempts(tmp_path) == _every_attempt()

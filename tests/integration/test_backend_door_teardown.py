"""A job on backend "ringtorch" tears down quietly when rank 0, which hosts torch's TCPStore,
exits before the other ranks destroy their groups.

torch's store client prints every failed round trip to stderr (``recvValue failed``, from
``doWait``, ``check`` or ``add``), so any store use left at teardown on the later ranks shows
up there. The ranks are tests/integration/_door_teardown_ranks.py; the order is forced by
markers: the later ranks destroy their groups only once rank 0's process has exited.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ringtorch.testing import wait_for
from ringtorch.testing.harness import job_port

RANKS = str(Path(__file__).with_name("_door_teardown_ranks.py"))
WORLD = 4


def test_later_ranks_tear_down_without_store_errors_after_rank_0_exits(tmp_path: Path) -> None:
    port = job_port()
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))}
    procs = [subprocess.Popen(
        [sys.executable, RANKS, str(tmp_path)],
        env={**base, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(WORLD),
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(WORLD)]
    try:
        out0, err0 = procs[0].communicate(timeout=180)
        wait_for(lambda: all((tmp_path / f"ready-{r}").exists() for r in range(1, WORLD)),
                 timeout=60, what="the later ranks past their all_reduce")
        (tmp_path / "go").touch()  # rank 0's process is gone: the others tear down now
        results = [(out0, err0)] + [p.communicate(timeout=120) for p in procs[1:]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    total = sum(range(1, WORLD + 1))
    for rank, (proc, (out, err)) in enumerate(zip(procs, results, strict=True)):
        assert proc.returncode == 0, f"rank {rank} failed:\n{err}"
        assert f"rank {rank}: all_reduce {total}" in out
        assert f"rank {rank} of {WORLD}: done" in out
        assert err.strip() == "", f"rank {rank} printed at teardown:\n{err}"

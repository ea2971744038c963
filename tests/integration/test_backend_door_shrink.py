"""shrink_group through the backend door: a torch program on backend "ringtorch" loses a rank
to SIGKILL mid-training, and its survivors shrink the default group with
``ringtorch.c10d.shrink_group`` (torch's own function cannot hold a backend written in Python,
and says so) and go on: torch's world size and ranks are the new world's, an all_reduce, a
functional all_reduce and a DDP step on the new default group give NumPy's values over the
survivors, and torch's argument checks keep torch's messages.

The ranks are tests/integration/_door_shrink_ranks.py (world 3, rank 1 dies at step 3).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist

from ringtorch.testing.harness import job_port

RANKS = str(Path(__file__).with_name("_door_shrink_ranks.py"))
WORLD, VICTIM = 3, 1
pytestmark = pytest.mark.skipif(not hasattr(dist, "shrink_group"),
                                reason="this torch has no shrink_group")


def _torch_error(call: Any) -> str:
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError("torch's check raised nothing")


def _run() -> list[dict[str, Any]]:
    port = job_port()
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))}
    procs = [subprocess.Popen(
        [sys.executable, RANKS, str(VICTIM), "3"],
        env={**base, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(WORLD),
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(WORLD)]
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert procs[VICTIM].returncode == -9
    seen = []
    for r, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        if r == VICTIM:
            continue
        assert p.returncode == 0, f"rank {r} failed:\n{err}\nits output:\n{out[-2000:]}"
        seen.append(json.loads(re.search(r"^RESULT (.*)$", out, re.M).group(1)))
    return seen


def test_survivors_shrink_through_the_door_and_train_on() -> None:
    c10d = dist.distributed_c10d
    survivors = [r for r in range(WORLD) if r != VICTIM]
    for got in _run():
        old = got["rank"]
        assert re.search(rf"\brank {VICTIM}\b", got["error"]), got["error"]
        errors = got["errors"]
        assert errors["empty"] == _torch_error(lambda: c10d._validate_shrink_inputs([], 0))
        assert errors["flags"] == _torch_error(lambda: c10d._validate_shrink_inputs([1], 7))
        info = {"group_size": WORLD, "current_rank": old}
        assert errors["self"] == _torch_error(
            lambda: c10d._validate_and_process_excluded_ranks([old], info))  # noqa: B023
        assert errors["range"] == _torch_error(
            lambda: c10d._validate_and_process_excluded_ranks([WORLD], info))  # noqa: B023
        assert errors["torch"].startswith("TypeError: Process group backend for ")
        assert "ringtorch.c10d.shrink_group with the same arguments" in errors["torch"]
        assert got["default_is_new"]
        assert (got["rank_after"], got["size_after"]) == (survivors.index(old), len(survivors))
        assert got["backend_after"] == "ringtorch"
        assert got["hang_asks"] == survivors  # a hang report asks the survivors, not rank 1
        expected = sum(np.arange(4, dtype=np.float64) + 10.0 * r for r in survivors)
        np.testing.assert_array_equal(got["all_reduce"], expected)
        np.testing.assert_array_equal(got["functional"], np.full(3, float(sum(survivors))))
        # DDP averages the gradients: each rank's is 2 * (rank + 1) in every component
        grad = np.mean([2.0 * (r + 1) for r in survivors])
        np.testing.assert_allclose(got["ddp_grad"], np.full(3, grad))

"""Rank-side code of tests/integration/test_frozen_rank.py: every rank runs one all_reduce,
then the test freezes rank ``victim`` with SIGSTOP and the others run the next all_reduce,
which must time out at the group's timeout naming the frozen rank. The test resumes the
victim once the others have raised (marker files order every step; nothing sleeps for a
fixed time)."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

import ringtorch.distributed as dist
from ringtorch.testing import wait_for

TIMEOUT_S = 4.0


def frozen_peer(rank: int, world_size: int, victim: int, marker_dir: str,
                hosts: str = "") -> dict[str, Any]:
    """Live ranks return their error's type and message, how long after the call it came and
    when (time.monotonic()); the victim, resumed, returns the error of its next call (or of
    the one after: see below)."""
    if hosts:  # fake hosts: the hierarchical transport (shared memory within each)
        os.environ.update({"RINGTORCH_HOST_ID": f"host-{hosts[rank]}",
                           "RINGTORCH_SOCKET_ADDR": "127.0.0.1"})
    torch.set_num_threads(1)
    markers = Path(marker_dir)
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    backend = dist.group.WORLD._get_backend()
    dist.all_reduce(torch.ones(1000))
    if rank == victim:
        # written whole, then renamed: the test reads it as soon as the name appears
        (markers / "victim.pid.tmp").write_text(str(os.getpid()))
        os.rename(markers / "victim.pid.tmp", markers / "victim.pid")
        # stopped in here, resumed after the others raised
        wait_for((markers / "released").exists, 60, "the test to resume this rank")
    else:
        wait_for((markers / "stopped").exists, 60, "the victim to be stopped")
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1000))
        error: BaseException | None = None
    except Exception as exc:
        error = exc
    raised_at = time.monotonic()  # one clock for every process of the host
    if rank == victim and error is None:
        # Resumed, the victim may find its call's data already sent by the others before
        # they gave up (a socket exchange between two hosts' leaders) and complete it before
        # its reader thread has read their abort; its next call fails in any case.
        try:
            dist.all_reduce(torch.ones(1000))
        except Exception as exc:
            error = exc
    if rank != victim:
        (markers / f"done{rank}").write_text("")
    return {"type": type(error).__name__, "message": str(error), "elapsed": raised_at - start,
            "raised_at": raised_at,
            "dist_error": isinstance(error, dist.DistError), "topology": backend.topology}

"""Rank-side code of tests/integration/test_timeout_texts.py: a rank that does not come, under
ringtorch or torch's gloo (the same code for both), and the error the waiting rank gets.

Rank 1 stays away until rank 0 has its error (a marker file), then leaves; the functions
return rank 0's (exception type, message) and None elsewhere.
"""

from __future__ import annotations

import importlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from ringtorch.testing import wait_for
from tests.integration._failures_ranks import error_of


def missing_rank(rank: int, ws: int, library: str, case: str,
                 marker: str) -> tuple[str, str] | None:
    """Rank 0 runs ``case`` ("barrier", "all_reduce", "monitored": a 1 s monitored barrier,
    "monitored_no_time": a monitored barrier with no time at all) while rank 1 stays away."""
    dist: Any = importlib.import_module(library)
    dist.init_process_group("gloo", timeout=timedelta(seconds=1))
    done = Path(marker)
    if rank != 0:
        wait_for(done.exists, 60, "rank 0's error")
        return None
    if case == "barrier":
        error = error_of(dist.barrier)
    elif case == "all_reduce":
        error = error_of(dist.all_reduce, torch.ones(4))
    elif case == "monitored":
        error = error_of(dist.monitored_barrier, timeout=timedelta(seconds=1))
    else:
        error = error_of(dist.monitored_barrier, timeout=timedelta(seconds=0))
    done.touch()
    return error

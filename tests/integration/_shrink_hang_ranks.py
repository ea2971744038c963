"""Rank programs of tests/integration/test_shrink_hang_report.py: a hang in a world that
shrank. The rank that dies is played by a forked child (``_shrink_ranks._as_victim``); the
survivor that stalls waits in the store until the report is made, never for a fixed time."""

from __future__ import annotations

import logging
import os
import signal
from datetime import timedelta
from typing import Any

import torch

import ringtorch.distributed as dist
from ringtorch._observe.hang_ask import HANG, key
from tests.integration._shrink_ranks import _as_victim

TIMEOUT = timedelta(seconds=3)


class _Warnings(logging.Handler):
    """The stall warnings this process logs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "has waited" in record.getMessage():
            self.texts.append(record.getMessage())


def stalls_after_a_shrink(rank: int, world_size: int, victim: int, culprit: int) -> Any:
    """``victim`` is SIGKILLed after the first all_reduce; the others shrink with
    shrink_on_failure and all_reduce once on the shrunk world; then ``culprit`` (a number of
    the world as started) skips the next all_reduce until the hang report is made, and the
    others return the error (naming the report) and the stall warnings they got."""
    def play() -> None:
        dist.init_process_group("gloo", timeout=TIMEOUT)
        dist.all_reduce(torch.ones(4))
        os.kill(os.getpid(), signal.SIGKILL)

    if rank == victim:
        return _as_victim(play)
    dist.init_process_group("gloo", timeout=TIMEOUT)
    dist.all_reduce(torch.ones(4))
    try:
        for _ in range(1000):
            dist.all_reduce(torch.ones(4))
    except dist.DistError as exc:
        world = dist.shrink_on_failure(exc)
    dist.all_reduce(torch.ones(64))
    name = dist.group.WORLD.group_name
    if rank == culprit:
        HANG.store.wait([key("report", HANG.report_epoch, name)], timedelta(seconds=60))
        return {"new_rank": world.rank, "skipped": True}
    warnings = _Warnings()
    logging.getLogger("ringtorch").addHandler(warnings)
    try:
        dist.all_reduce(torch.ones(64))
    except dist.DistError as exc:
        return {"new_rank": world.rank, "error": str(exc), "group": name,
                "warnings": warnings.texts}
    return {"new_rank": world.rank, "error": None}

"""Rank-side code of tests/integration/test_hang_report.py: each function makes one kind of
hang, and every rank that is not the culprit returns the error it got (the timeout or
mismatch error, which names the hang report). A culprit stays stuck until the report has been
made (the store key the reporting rank sets), so nothing here sleeps for a fixed time."""

from __future__ import annotations

import ctypes
import os
import threading
import time
from datetime import timedelta

import torch

import ringtorch.distributed as dist
import ringtorch.distributed.rpc as rpc
from ringtorch._observe.hang_ask import HANG, key
from ringtorch.testing import wait_for

TIMEOUT = timedelta(seconds=3)


def _report_made() -> bool:
    return HANG.store.check([key("report", HANG.epoch, "0")])


def _others(rank: int) -> str:
    try:
        dist.all_reduce(torch.ones(64))
    except dist.DistError as exc:
        return str(exc)
    return "the collective completed"


def skips_a_collective(rank: int, ws: int, culprit: int) -> str:
    """``culprit`` does not call the second all_reduce: it waits in the store for the report."""
    dist.init_process_group("gloo", timeout=TIMEOUT)
    dist.all_reduce(torch.ones(64))
    if rank == culprit:
        HANG.store.wait([key("report", HANG.epoch, "0")], timedelta(seconds=60))
        return "skipped"
    return _others(rank)


def stuck_in_sleep(rank: int, ws: int, culprit: int) -> str:
    """``culprit`` sleeps (in C, without the GIL) until the report has been made."""
    dist.init_process_group("gloo", timeout=TIMEOUT)
    dist.all_reduce(torch.ones(64))
    if rank == culprit:
        while not _report_made():
            time.sleep(0.2)  # the hang under test: a rank stuck in time.sleep
        return "slept"
    return _others(rank)


def stuck_in_python_loop(rank: int, ws: int, culprit: int) -> str:
    """``culprit`` spins in a pure-Python loop (holding the GIL but for the switch interval)."""
    dist.init_process_group("gloo", timeout=TIMEOUT)
    dist.all_reduce(torch.ones(64))
    if rank == culprit:
        spins = 0
        while spins % 200_000 != 0 or not _report_made():
            spins += 1
        return "spun"
    return _others(rank)


def calls_another_collective(rank: int, ws: int, culprit: int) -> str:
    """``culprit`` broadcasts where the others all_reduce."""
    dist.init_process_group("gloo", timeout=TIMEOUT)
    dist.all_reduce(torch.ones(64))
    if rank == culprit:
        try:
            dist.broadcast(torch.ones(64), src=0)
        except dist.DistError as exc:
            return str(exc)
        return "the collective completed"
    return _others(rank)


def slow_callee(ready: str, done: str) -> int:
    """Runs on worker1: tells the test it has started, then sleeps until the test is done."""
    open(ready, "w").close()
    while not os.path.exists(done):
        time.sleep(0.05)  # the hang under test: an RPC callee asleep
    return 7


def waits_on_rpc(rank: int, ws: int, ready: str, done: str) -> int:
    """Rank 0 calls worker1's slow_callee with rpc_sync; the others only serve."""
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=ws)
    result = -1
    if rank == 0:
        result = rpc.rpc_sync("worker1", slow_callee, args=(ready, done))
    rpc.shutdown()
    return result


def holds_the_gil_in_c(rank: int, ws: int, culprit: int, fifo: str) -> str:
    """``culprit`` blocks in read(2) called WITH the GIL held (ctypes.PyDLL does not release
    it): no thread of it can run Python, so only faulthandler's signal handler can give its
    stacks. The test writes a byte into ``fifo`` once the report exists."""
    dist.init_process_group("gloo", timeout=TIMEOUT)
    dist.all_reduce(torch.ones(64))
    if rank == culprit:
        fd = os.open(fifo, os.O_RDWR)  # read/write: neither open nor read sees an EOF
        buf = ctypes.create_string_buffer(1)
        while ctypes.PyDLL(None).read(fd, buf, 1) != 1:  # the hang under test
            pass  # interrupted by the stacks signal: read again
        os.close(fd)
        return "held"
    return _others(rank)


def with_reports_off(rank: int, ws: int, marker: str) -> tuple[str, list[str]]:
    """RINGTORCH_HANG_REPORT=0: rank 1 skips the collective until rank 0 has its error."""
    dist.init_process_group("gloo", timeout=TIMEOUT)
    dist.all_reduce(torch.ones(64))
    threads = sorted(t.name for t in threading.enumerate())
    if rank == 1:
        wait_for(lambda: os.path.exists(marker), 60, "rank 0's error")
        return "skipped", threads
    error = _others(rank)
    open(marker, "w").close()
    return error, threads

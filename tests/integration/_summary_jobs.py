"""Training-like programs that tests/integration/test_job_summary.py runs under ringrun.

``python _summary_jobs.py straggler``: ten all_reduces of 1000 float32 (rank 2 sleeps
``SLEEP_S`` before each, so the others wait for it), one send of 100 int64 from rank 0 to
rank 1, one broadcast. ``python _summary_jobs.py fails``: three all_reduces, then rank 1
raises (once the others' summary files show their calls) while the others block until the
launcher stops them. ``python _summary_jobs.py
rpc``: RPC only (no process group): rank 0 calls rank 1 four times.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

import ringtorch.distributed as dist
from ringtorch.testing import wait_for

SLEEP_S = float(os.environ.get("SLEEP_S", "0.1"))


def straggler() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for _ in range(10):
        if rank == 2:
            time.sleep(SLEEP_S)
        dist.all_reduce(torch.ones(1000))
    if rank == 0:
        dist.send(torch.arange(100), dst=1)
    elif rank == 1:
        dist.recv(torch.zeros(100, dtype=torch.int64), src=0)
    dist.broadcast(torch.ones(10), src=0)
    dist.destroy_process_group()


def fails() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for _ in range(3):
        dist.all_reduce(torch.ones(1000))
    if rank == 1:
        # Fail once the others' running totals show their three calls (their summary files,
        # rewritten as the totals change), so what they leave is known.
        wait_for(lambda: all(_calls_written(other, "allreduce") >= 3 for other in (0, 2)),
                 60, "ranks 0 and 2's totals")
        raise ValueError("rank 1 cannot go on")
    time.sleep(600)  # the launcher stops the others when rank 1 fails


def _calls_written(rank: int, op: str) -> int:
    path = os.path.join(os.environ["RINGTORCH_OBSERVE_DIR"], f"summary-{rank}.json")
    try:
        with open(path) as f:
            return int(json.load(f)["ops"].get(op, {}).get("calls", 0))
    except FileNotFoundError:
        return 0


def rpc_only() -> None:
    import ringtorch.distributed.rpc as rpc

    rank = int(os.environ["RANK"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    if rank == 0:
        for _ in range(4):
            rpc.rpc_sync("worker1", torch.add, args=(torch.ones(2), 1))
    rpc.shutdown()


if __name__ == "__main__":
    {"straggler": straggler, "fails": fails, "rpc": rpc_only}[sys.argv[1]]()

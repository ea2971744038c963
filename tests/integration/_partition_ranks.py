"""Rank programs of tests/integration/test_partition.py, run inside the two-host harness.

``python _partition_ranks.py all_reduce|ping_pong|rpc|store_client`` (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT from the environment) loops on its workload and prints one JSON line per event on
stdout: ``{"event": "looping"}`` once the loop runs, then ``{"event": "error", ...}`` with the
exception's class, its base classes, its message and the wall-clock time it was raised, and
``{"event": "exited"}`` once the group, the RPC agent or the store client is shut down (the
store client first reports its next request's error as ``{"event": "again", ...}``).
``store_server`` serves a TCPStore on MASTER_ADDR:MASTER_PORT until its stdin closes.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch


def _say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def _loop(step: Callable[[], None]) -> None:
    step()
    _say(event="looping")
    try:
        while True:
            step()
    except Exception as exc:
        _report("error", exc)


def _report(event: str, exc: BaseException) -> None:
    _say(event=event, type=type(exc).__name__, bases=[c.__name__ for c in type(exc).__mro__],
         message=str(exc), at=time.time())


def all_reduce_loop() -> None:
    import ringtorch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1000)
    _loop(lambda: dist.all_reduce(t.fill_(1.0)))
    dist.destroy_process_group()
    _say(event="exited")


def ping_pong_loop() -> None:
    """Ranks 0 and 1 pass a tensor back and forth with send and recv."""
    import ringtorch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.ones(1000)

    def step() -> None:
        if rank == 0:
            dist.send(t, 1)
            dist.recv(t, 1)
        else:
            dist.recv(t, 0)
            dist.send(t, 0)

    _loop(step)
    dist.destroy_process_group()
    _say(event="exited")


def rpc_loop() -> None:
    import ringtorch.distributed.rpc as rpc

    rank = int(os.environ["RANK"])
    size = int(os.environ["WORLD_SIZE"])
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=size)
    callee = f"worker{(rank + 1) % size}"
    _loop(lambda: rpc.rpc_sync(callee, torch.add, args=(torch.ones(10), 1)))
    rpc.shutdown(graceful=False)
    _say(event="exited")


def _store(is_master: bool) -> object:
    from ringtorch.store import TCPStore

    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, is_master,
                    timedelta(seconds=60), wait_for_workers=False)


def store_server() -> None:
    store = _store(True)
    _say(event="serving")
    sys.stdin.read()
    store.close()  # type: ignore[attr-defined]


def store_client() -> None:
    store: Any = _store(False)
    _loop(lambda: store.add("n", 1))
    try:
        store.add("n", 1)
    except Exception as exc:
        _report("again", exc)
    store.close()
    _say(event="exited")


if __name__ == "__main__":
    {"all_reduce": all_reduce_loop, "ping_pong": ping_pong_loop, "rpc": rpc_loop,
     "store_client": store_client, "store_server": store_server}[sys.argv[1]]()

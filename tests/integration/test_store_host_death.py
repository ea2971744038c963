"""The store's host dies while the other ranks are still in init_process_group: every rank
raises within a second or two, naming the store's address and rank 0, instead of retrying
the connection for the whole timeout (torch errors at once too)."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta

from ringtorch.store import TCPStore
from ringtorch.testing import wait_for
from ringtorch.testing.harness import job_port

MASTER = r"""
import sys, time
from datetime import timedelta
from ringtorch.store import TCPStore
store = TCPStore("127.0.0.1", int(sys.argv[1]), 3, True, timedelta(seconds=60),
                 wait_for_workers=False)
print("ready", flush=True)
time.sleep(600)
"""

RANK = r"""
import sys, time
import ringtorch.distributed as dist
try:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}",
                            rank=int(sys.argv[1]), world_size=3)
    print("initialised", flush=True)
except Exception as exc:
    print(f"{time.monotonic()} {type(exc).__name__}: {exc}", flush=True)
"""


def test_ranks_in_init_raise_within_seconds_when_the_store_host_dies() -> None:
    port = job_port()
    master = subprocess.Popen([sys.executable, "-c", MASTER, str(port)], stdout=subprocess.PIPE,
                              text=True)
    ranks: list[subprocess.Popen[str]] = []
    try:
        assert master.stdout is not None and master.stdout.readline() == "ready\n"
        watcher = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30))
        ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(r), str(port)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for r in (1, 2)]
        def connected() -> bool:
            assert all(r.poll() is None for r in ranks)
            # each rank counts its initializations in the store first: then it is connected
            return watcher.check([f"rt_init_generation/{r}" for r in (1, 2)])

        wait_for(connected, 60, "both ranks to connect to the store")
        master.kill()
        killed = time.monotonic()
        outputs = [r.communicate(timeout=60) for r in ranks]
    finally:
        for proc in (master, *ranks):
            proc.kill()
            proc.wait()
    for out, err in outputs:
        when, _, message = out.strip().partition(" ")
        assert float(when) - killed < 2.5, (out, err)
        assert message.startswith(
            f"DistNetworkError: lost the connection to TCPStore 127.0.0.1:{port} ("), (out, err)
        assert message.endswith(
            "the server process (the master, rank 0) exited or crashed"), (out, err)

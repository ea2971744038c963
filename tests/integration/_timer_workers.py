"""Workers of test_elastic_timer.py, importable by spawned processes. Each takes the timer
package to use by name ("ringtorch..." or "torch..."), so one test drives either."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from typing import Any


def overrun(package: str, queue: Any, after: float, marker: str) -> None:
    """Acquire a timer of ``after`` seconds and get stuck inside it."""
    timer = importlib.import_module(package)
    timer.configure(timer.LocalTimerClient(queue))
    with timer.expires(after=after, scope="overrun"):
        Path(marker).touch()
        time.sleep(120)  # stuck: only the timer server ends this process


def in_time(package: str, queue: Any, after: float) -> None:
    """Finish the block well within ``after`` seconds, then outlive the timer's deadline."""
    timer = importlib.import_module(package)
    timer.configure(timer.LocalTimerClient(queue))
    with timer.expires(after=after, scope="in_time"):
        pass
    time.sleep(after * 3)  # past the deadline: a released timer must not fire


def file_worker() -> None:
    """``python _timer_workers.py PACKAGE PIPE SIGNAL AFTER WORK``: a FileTimerClient worker
    whose block takes WORK seconds under a timer of AFTER seconds, then outlives the deadline."""
    package, pipe, sig, after, work = sys.argv[1:6]
    timer = importlib.import_module(package)
    client = timer.FileTimerClient(pipe, signal=int(sig))
    with timer.expires(after=float(after), scope="file_block", client=client):
        print("inside", flush=True)
        time.sleep(float(work))
    time.sleep(float(after) * 2)


def file_server() -> None:
    """``python _timer_workers.py server PACKAGE PIPE``: a FileTimerServer until killed."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    package, pipe = sys.argv[2:4]
    timer = importlib.import_module(package)
    server = timer.FileTimerServer(pipe, run_id="timer_job", max_interval=0.1)
    server.start()
    print("ready", flush=True)
    time.sleep(120)


if __name__ == "__main__":
    file_server() if sys.argv[1] == "server" else file_worker()

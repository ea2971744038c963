"""A ringrun worker of test_world_hang_report.py (world 3, --on-worker-failure continue,
--max-restarts 1). CONTROL, the first argument, is a folder the test and the workers share.

1. The one started as rank 1 SIGKILLs itself at step 2; the survivors shrink (0 and 2 become
   ranks 0 and 1). Then the one started as 2 stalls in Python (writes CONTROL/stalled, waits
   for CONTROL/release) while rank 0 waits in an all_reduce (writes CONTROL/waiting once it
   is in it): the test asks ringrun for a report (SIGUSR1) meanwhile, then has the stalled
   one ask through the store as ``python -m ringtorch.distributed.debug host:port`` does
   (CONTROL/ask; it writes the report into CONTROL/debug-report.txt).
2. ringrun's replacement for rank 1 joins; the survivors admit it. Every rank makes a group
   with a 3 s timeout, on which the one started as 0 skips an all_reduce (it waits for
   CONTROL/done-1 and done-2): the other two time out, each naming its hang report.

Each worker prints ``worker <started rank>: <what happened, JSON>``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

import torch

import ringtorch.distributed as dist
from ringtorch.distributed.debug import via_store
from ringtorch.testing import wait_for


def _wait_file(path: Path) -> None:
    wait_for(path.exists, 60, str(path))  # bounded: the test creates it, or fails first


def main(control: Path) -> None:
    slot = int(os.environ["RANK"])
    record: dict = {}
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    if dist.joined_running_job() is None:
        for step in range(100):
            if slot == 1 and step == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                dist.all_reduce(torch.ones(4))
            except dist.DistError as exc:
                record["shrunk"] = dist.shrink_on_failure(exc).rank
                break
        if slot == 2:
            (control / "stalled").touch()
            _wait_file(control / "ask")
            text, _ = via_store(f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", None)
            (control / "debug-report.txt").write_text(text)
            _wait_file(control / "release")
        work = dist.all_reduce(torch.ones(4), async_op=True)
        if slot == 0:
            (control / "waiting").touch()
        work.wait()
        while dist.admit_joiners() is None:  # until ringrun's replacement is admitted
            dist.all_reduce(torch.ones(4))
    group = dist.new_group(timeout=timedelta(seconds=3))
    if slot == 0:  # skips the collective; stays to answer the others' reports
        _wait_file(control / "done-1")
        _wait_file(control / "done-2")
    else:
        try:
            dist.all_reduce(torch.ones(4), group=group)
        except dist.DistError as exc:
            record["error"] = str(exc)
        (control / f"done-{slot}").touch()
    record["world"] = dist.get_world_size()
    print(f"worker {slot}: {json.dumps(record)}", flush=True)
    os._exit(0)  # the timed-out group is aborted: nothing of it to tear down in step


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""A process of test_grow.py, started with the job's environment (RANK, WORLD_SIZE, MASTER_*,
TORCHELASTIC_USE_AGENT_STORE=True: the store is served by the test process).

    member STEPS DIE_AT VICTIMS   train STEPS steps of an all_reduce of (slot + 1); the VICTIMS
                                  (comma-separated ranks) SIGKILL themselves at step DIE_AT;
                                  the survivors shrink, set "shrunk/<slot>" and, before their
                                  next step, wait for the test's "go" key; every rank calls
                                  admit_joiners once per step
    joiner STEPS TIMEOUT_S        RINGTORCH_JOIN=1 is set: init_process_group joins the running
                                  job, then goes on with the members' loop at their step
    idle                          init, then wait for the test's "done" key (nobody admits)

The last line printed is a JSON record of what happened, read by the test.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from datetime import timedelta

import torch

import ringtorch.distributed as dist


def _control() -> dist.TCPStore:
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         is_master=False)


def _sync_after_growth(step: int) -> int:
    """The members' step count and a 'model' tensor, from rank 0 to the joiners."""
    counts = torch.tensor([step])
    dist.broadcast(counts, group_src=0)
    return int(counts.item())


def _train(store: dist.TCPStore, slot: int, step: int, steps: int, die_at: int,
           victims: list[int], record: dict, joined: bool = False) -> None:
    """``joined``: this process was just admitted (and synced): its first step starts after
    the admission, where the members' does."""
    sums, shrunk = record.setdefault("sums", []), False
    while step < steps:
        if step == die_at and slot in victims:
            os.kill(os.getpid(), signal.SIGKILL)
        if shrunk:
            store.wait(["go"], timedelta(seconds=60))
            shrunk = False
        try:
            grown = None if joined else dist.admit_joiners()
            joined = False
            if grown is not None:
                record["grown"] = [grown.rank, grown.world_size, grown.previous_world_size,
                                   list(grown.joined_ranks), grown.is_joiner]
                step = _sync_after_growth(step)
            t = torch.tensor([float(slot + 1)])
            dist.all_reduce(t)
        except dist.DistError as exc:
            world = dist.shrink_on_failure(exc)
            record["shrunk"] = [world.rank, world.world_size, list(world.lost_ranks)]
            store.set(f"shrunk/{slot}", "1")
            step, shrunk = _sync_after_growth(step), True
            continue
        sums.append([step, dist.get_world_size(), t.item()])
        step += 1
    record.update(rank=dist.get_rank(), world=dist.get_world_size(),
                  ranks=dist.get_process_group_ranks(dist.group.WORLD))


def main(argv: list[str]) -> None:
    role, slot = argv[0], int(os.environ["RANK"])
    record: dict = {"slot": slot}
    try:
        if role == "joiner":
            dist.init_process_group("gloo", timeout=timedelta(seconds=float(argv[2])))
            store = _control()
            joined = dist.joined_running_job()
            assert joined is not None and joined.is_joiner
            record["joined"] = [joined.rank, joined.world_size, joined.previous_world_size,
                                list(joined.joined_ranks)]
            step = _sync_after_growth(0)
            _train(store, slot, step, int(argv[1]), -1, [], record, joined=True)
        else:
            store = _control()
            dist.init_process_group("gloo", timeout=timedelta(seconds=30))
            if role == "idle":
                store.set(f"ready/{slot}", "1")
                store.wait(["done"], timedelta(seconds=60))
            else:
                _train(store, slot, 0, int(argv[1]), int(argv[2]),
                       [int(v) for v in argv[3].split(",")], record)
        dist.destroy_process_group()
    except Exception as exc:  # the test matches the message
        record["error"] = [type(exc).__name__, str(exc)]
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

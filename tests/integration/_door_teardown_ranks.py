"""One rank of a plain torch job on backend "ringtorch" that ends after its store host: run by
test_backend_door_teardown.py.

    python _door_teardown_ranks.py DIR      # env:// (RANK, WORLD_SIZE, MASTER_ADDR/PORT)

Every rank does one all_reduce. Rank 0 (whose process hosts torch's TCPStore) then destroys
its group and exits; the others write ``DIR/ready-<rank>`` and wait for ``DIR/go``, which the
test creates once rank 0's process is gone, then destroy their groups and exit.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

from ringtorch.testing import wait_for


def main(folder: str) -> None:
    dist.init_process_group("ringtorch")
    rank, size = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    print(f"rank {rank}: all_reduce {t[0].item():g}", flush=True)
    if rank != 0:
        open(os.path.join(folder, f"ready-{rank}"), "w").close()
        go = os.path.join(folder, "go")  # the test's marker, made once rank 0 has exited
        wait_for(lambda: os.path.exists(go), 120, "the test's marker that rank 0 has exited")
    dist.destroy_process_group()
    print(f"rank {rank} of {size}: done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])

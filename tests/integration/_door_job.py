"""A plain torch program on backend "ringtorch", run by the launch-path tests
(test_backend_door_launch.py) under torchrun, ringrun, mp.spawn and init_method URLs.

It never imports ringtorch: the backend's name is all it knows. Each rank prints one line,
``rank R of W: all_reduce S broadcast B``, which the tests check against arithmetic.

    python _door_job.py                 # launched: env:// (RANK, WORLD_SIZE, MASTER_*)
    python _door_job.py spawn W URL     # mp.spawn of W ranks meeting at URL (tcp:// or file://)
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist


def work(init_method: str | None = None, rank: int = -1, world_size: int = -1) -> None:
    dist.init_process_group("ringtorch", init_method=init_method, rank=rank,
                            world_size=world_size)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    t = torch.full((4,), float(rank + 1))
    for _ in range(3):
        dist.all_reduce(t)
    b = torch.full((2,), float(rank))
    dist.broadcast(b, src=world_size - 1)
    print(f"rank {rank} of {world_size}: all_reduce {t[0].item():g} broadcast "
          f"{b[0].item():g} backend {dist.get_backend()}", flush=True)
    dist.destroy_process_group()


def _spawned(rank: int, world_size: int, url: str) -> None:
    work(url, rank, world_size)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "spawn":
        import torch.multiprocessing as mp

        mp.spawn(_spawned, args=(int(sys.argv[2]), sys.argv[3]), nprocs=int(sys.argv[2]))
    else:
        work()

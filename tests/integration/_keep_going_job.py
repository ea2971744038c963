"""A ringrun worker of test_ringrun_keep_going.py: rank 2 is SIGKILLed at step 3; the others
shrink the job and finish, checking each all_reduce against the sum of the ranks' inputs."""

from __future__ import annotations

import os
import signal

import torch

import ringtorch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
sums = []
step = 0
while step < 6:
    if rank == 2 and step == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.tensor([float(10 ** rank)])
    try:
        dist.all_reduce(t)
    except dist.DistError as exc:
        shrunk = dist.shrink_on_failure(exc)
        rank, world = shrunk.rank, shrunk.world_size
        continue
    sums.append(int(t.item()))
    step += 1
print(f"worker {os.environ['RANK']}: now rank {rank} of {world}, sums {sums}", flush=True)
dist.destroy_process_group()

"""Rank-side code of test_dist_autograd_ddp.py: two ranks, each an RPC worker and a member of
one process group, run DDP's forward and a distributed backward; they return the context's
gradients and what ``.grad`` held before and after."""

from __future__ import annotations

from typing import Any

import torch

import ringtorch.distributed as dist
import ringtorch.distributed.autograd as dist_autograd
import ringtorch.distributed.rpc as rpc
from ringtorch.nn.parallel import DistributedDataParallel as DDP
from tests.integration._rpc_common import start


def model() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def batch(rank: int, step: int) -> torch.Tensor:
    return torch.arange(8.0).reshape(2, 4) * (rank + 1) / 10 - step


def scenario(rank: int, ws: int, pg_port: int, as_view: bool) -> dict[str, Any]:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{pg_port}", rank=rank,
                            world_size=ws)
    start(rank, ws)
    ddp = DDP(model(), gradient_as_bucket_view=as_view)
    params = list(ddp.parameters())
    marks = [torch.full_like(p, 7.0) for p in params]
    for p, mark in zip(params, marks, strict=True):
        p.grad = mark  # must be there, untouched, after the distributed backward
    steps = []
    for step in range(2):  # the second step reuses DDP's buckets: the first's grads must stay
        with dist_autograd.context() as context_id:
            loss = ddp(batch(rank, step)).pow(2).sum()
            dist_autograd.backward(context_id, [loss])
            grads = dist_autograd.get_gradients(context_id)
            steps.append([grads[p].clone() for p in params])
            if len(steps) == 1:
                kept = [grads[p] for p in params]  # looked at again after the second step
    out = {"steps": steps, "kept": kept,
           "grad_untouched": all(p.grad is m for p, m in zip(params, marks, strict=True))
           and all(torch.equal(m, torch.full_like(m, 7.0)) for m in marks)}
    rpc.shutdown()
    dist.destroy_process_group()
    return out

"""Worker functions that tests/compat/test_elastic_launch.py launches with ``elastic_launch``,
under torch's launcher and under ringtorch's; each takes the ``dist`` module to use."""

from __future__ import annotations

import importlib
import os
from typing import Any

import torch

from ringtorch.testing import wait_for


def train(module: str, steps: int) -> dict[str, Any]:
    """A linear regression trained data-parallel: each rank its own shard of the data, the
    gradients averaged with all_reduce; returns the rank, the world and the final weights."""
    dist = importlib.import_module(module)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    shard = slice(rank * 64 // world, (rank + 1) * 64 // world)
    w = torch.zeros(3, 1, requires_grad=True)
    for _ in range(steps):
        loss = ((x[shard] @ w - y[shard]) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            dist.all_reduce(w.grad)
            w -= 0.1 * w.grad / world
            w.grad.zero_()
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "local_rank": int(os.environ["LOCAL_RANK"]),
            "weights": w.detach().flatten().tolist()}


def fail_on_rank(rank: int) -> int:
    """Raise on ``rank`` (the others return their rank)."""
    if int(os.environ["RANK"]) == rank:
        raise ValueError(f"bad batch on rank {rank}")
    return int(os.environ["RANK"])


def fail_first_attempt() -> tuple[int, int]:
    """Fail on rank 1 in the first attempt only; afterwards return (rank, restart count)."""
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if restart == 0 and os.environ["RANK"] == "1":
        raise RuntimeError("first attempt fails")
    return int(os.environ["RANK"]), restart


def fail_while_peer_runs(marker_dir: str) -> None:
    """Rank 1 starts and never returns; rank 0 raises once rank 1 is running."""
    import time

    marker = os.path.join(marker_dir, "rank1-started")
    if os.environ["RANK"] == "1":
        open(marker, "w").close()
        time.sleep(600)  # never returns by itself: the launcher must stop it
    wait_for(lambda: os.path.exists(marker), 60, "rank 1 to start")
    raise RuntimeError("rank 0 gives up")

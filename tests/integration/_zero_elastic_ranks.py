"""Rank program of tests/integration/test_zero_shrink_grow.py: ZeroRedundancyOptimizer through
a shrink (world 3 to 2) and a grow back (2 to 3).

The rank started as 1 forks a child that plays it and SIGKILLs itself after step ``KILL_AFTER``
(its optimizer shard, momentum included, dies with it); once rank 0 has trained ``AT_TWO``
steps at world 2 (a marker file; the members then wait for it at the step boundary), the
parent process joins the running job as rank 1's
replacement (``RINGTORCH_JOIN=1``), with a fresh model and a fresh optimizer, and gets the
parameters by broadcast and its shard of the optimizer state from ``rewrap``.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

import ringtorch.distributed as dist
from ringtorch.testing import wait_for

KILL_AFTER = 3  # the victim dies after this step (0-based), at a step boundary
AT_TWO = 3  # steps rank 0 trains at world 2 before the replacement may knock
LR, MOMENTUM = 0.05, 0.9
LR_AFTER_SHRINK = 0.02  # the members lower it once shrunk; a replacement's constructor has LR


def model() -> torch.nn.Module:
    """Three weights of distinct sizes (30, 20 and 4 elements): torch's greedy partition gives
    one to each rank at world 3, the largest to rank 0."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(5, 4, bias=False), torch.nn.Tanh(),
                               torch.nn.Linear(4, 1, bias=False))


def batch(step: int, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of the rank started as ``slot`` at ``step``."""
    g = torch.Generator().manual_seed(1000 * step + slot)
    return torch.randn(4, 6, generator=g), torch.randn(4, 1, generator=g)


def _counts(step: int, src: int) -> int:
    t = torch.tensor([step], dtype=torch.int64)
    dist.broadcast(t, group_src=src)
    return int(t.item())


def train(rank: int, world_size: int, steps: int, folder: str) -> Any:
    slot = rank
    marker = Path(folder, "at-two")
    if rank == 1:
        pid = os.fork()
        if pid == 0:
            try:
                _run(slot, steps, marker, die_after=KILL_AFTER)
            finally:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
        wait_for(marker.exists, timeout=60, what="rank 0 training at world 2")
        os.environ["RINGTORCH_JOIN"] = "1"
    return _run(slot, steps, marker)


def _run(slot: int, steps: int, marker: Path, die_after: int = -1) -> Any:
    from ringtorch.distributed.optim import ZeroRedundancyOptimizer
    from ringtorch.nn.parallel import DistributedDataParallel

    net = model()
    opt_args = {"optimizer_class": torch.optim.SGD, "lr": LR, "momentum": MOMENTUM}
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    joined = dist.joined_running_job()
    step = 0
    if joined is not None:  # the replacement: the survivors' parameters, then DDP and ZeRO
        dist.broadcast_module_state(net, group_src=joined.state_source)
    pair = dist.new_group([0, 2]) if joined is None else None  # rebuilt by the shrink
    ddp = DistributedDataParallel(net)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), **opt_args)
    torch_view: dict[str, Any] = {}
    if joined is not None:
        opt = opt.rewrap()  # its shard of the survivors' optimizer state
        step = _counts(step, joined.state_source)
    worlds: list[list[int]] = []  # per step done: the ranks (as started) that trained it
    admitted = joined is not None
    while step < steps:
        try:
            grown = None if admitted else dist.admit_joiners()
            admitted = False
            # after AT_TWO steps at world 2 the members wait at the boundary for the
            # replacement (which knocks once rank 0 wrote the marker), so the steps each
            # world trains are known
            while grown is None and sum(len(w) == 2 for w in worlds) == AT_TWO \
                    and dist.get_world_size() == 2:
                grown = dist.admit_joiners()
            if grown is not None:
                dist.broadcast_module_state(net, group_src=grown.state_source)
                ddp, opt = ddp.rewrap(), opt.rewrap()
                step = _counts(step, grown.state_source)
            x, y = batch(step, slot)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
            if step == KILL_AFTER:
                dist.barrier()  # every rank has this step's parameters: the kill is between steps
                if step == die_after:
                    os.kill(os.getpid(), signal.SIGKILL)
        except dist.DistError as exc:
            world = dist.shrink_on_failure(exc)
            torch_view["shrunk"] = _torch_view(world.replacement(pair).group_name, slot)
            ddp, opt = ddp.rewrap(), opt.rewrap()
            for group in opt.param_groups:  # as a scheduler would: the replacement gets it too
                group["lr"] = LR_AFTER_SHRINK
            step = _counts(step, 0)
            continue
        worlds.append(dist.get_process_group_ranks(dist.group.WORLD))
        step += 1
        if slot == 0 and sum(len(w) == 2 for w in worlds) == AT_TWO:
            marker.touch()
    torch_view["grown"] = _torch_view(None, slot)
    return {"world": dist.get_process_group_ranks(dist.group.WORLD), "worlds": worlds,
            "params": [p.detach().clone() for p in net.parameters()], "torch": torch_view}


def _torch_view(subgroup: str | None, slot: int) -> dict[str, Any]:
    """What torch.distributed's own functions see of the world: its default group's size and
    this rank, an all_reduce of 10 ** slot over it, and the same over the group torch's
    table holds under the name ``subgroup``."""
    import torch.distributed as tdist

    t = torch.tensor([10.0 ** slot])
    tdist.all_reduce(t)
    view = {"size": tdist.get_world_size(), "rank": tdist.get_rank(), "sum": t.item()}
    if subgroup is not None:
        group = tdist.distributed_c10d._resolve_process_group(subgroup)
        t = torch.tensor([10.0 ** slot])
        tdist.all_reduce(t, group=group)
        view["sub"] = (tdist.get_world_size(group), tdist.get_rank(group), t.item())
    return view

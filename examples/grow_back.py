"""Lose a rank, keep training, and grow back: a replacement joins the running job.

Run it under ringrun, which restarts the failed worker alone:

    ringrun --nproc-per-node 4 --on-worker-failure continue --max-restarts 1 \\
        examples/grow_back.py                      # rank 2 SIGKILLs itself at step 10
    ... examples/grow_back.py --victim 1 --kill-at 30 --steps 200

Every rank trains a small regression model with DDP and SGD with momentum, each reading its
share of the data through ElasticDistributedSampler; a step takes at least ``--step-s`` (as a
real model's would). At step ``--kill-at`` the victim SIGKILLs itself. The survivors' next
collective raises PeerLostError: they shrink the world (``dist.shrink_on_failure``) and go on.
ringrun restarts the victim alone with RINGTORCH_JOIN=1: its ``init_process_group`` joins the
running job, and the survivors admit it at their next step boundary (``dist.admit_joiners``,
called once per step). Then the first rank that is not a joiner (``state_source``: a
replacement for rank 0 is rank 0 of the grown world) sends the parameters
(``broadcast_module_state``, before DDP re-wraps: DDP broadcasts from rank 0), the momentum
buffers (``broadcast_optimizer_state``) and the step count, and the world is whole again: no
checkpoint, and the survivors never stopped. The victim may be any rank, rank 0 included
(ringrun's launcher serves the store in this mode).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ringtorch.distributed as dist
from ringtorch.distributed.elastic.utils.data import ElasticDistributedSampler
from ringtorch.nn.parallel import DistributedDataParallel

USER_CODE_AT = time.time()  # the imports are done: the program's own work starts here


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--victim", type=int, default=2, help="the rank that SIGKILLs itself")
    parser.add_argument("--kill-at", type=int, default=10, help="it dies at this step")
    parser.add_argument("--steps", type=int, default=150, help="train this many steps")
    parser.add_argument("--step-s", type=float, default=0.1,
                        help="a step takes at least this long (a real model's compute)")
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    parser.add_argument("--finish-short", action="store_true",
                        help="finish at --steps even while the world is smaller than it began "
                             "(by default training goes on, up to 10 times --steps, until the "
                             "replacement has joined)")
    return parser.parse_args(argv)


def make_data(samples: int = 4096) -> TensorDataset:
    """y = x . w + noise, the same on every rank (seeded)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 8, generator=gen)
    w = torch.randn(8, 1, generator=gen)
    return TensorDataset(x, x @ w + 0.01 * torch.randn(samples, 1, generator=gen))


def batches(data: TensorDataset, consumed: int, batch: int) -> Any:
    """This rank's batches of what is left of the epoch, for the current world."""
    sampler = ElasticDistributedSampler(data, num_replicas=dist.get_world_size(),
                                        rank=dist.get_rank(), start_index=consumed)
    return iter(DataLoader(data, batch_size=batch, sampler=sampler))


def sync_counts(step: int, consumed: int, src: int = 0) -> tuple[int, int]:
    """Rank ``src``'s step and samples consumed, on every rank (the survivors may be a step
    apart; a joiner knows neither)."""
    counts = torch.tensor([step, consumed])
    dist.broadcast(counts, group_src=src)
    return int(counts[0]), int(counts[1])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # model, data and optimizer first: a replacement's survivors do not wait for this work
    # (torch's first optimizer imports torch._dynamo: seconds on a busy machine)
    torch.manual_seed(0)
    data = make_data()
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    dist.init_process_group("gloo")  # a replacement (RINGTORCH_JOIN=1) joins the job here
    joined = dist.joined_running_job()
    if joined is not None:  # the members do the same in their admit_joiners branch below
        dist.broadcast_module_state(model, group_src=joined.state_source)
    ddp = DistributedDataParallel(model)  # the parameters of rank 0, joiners included
    step, consumed, first_loss, full_world = 0, 0, None, dist.get_world_size()
    if joined is not None:
        dist.broadcast_optimizer_state(opt, group_src=joined.state_source)
        step, consumed = sync_counts(step, consumed, joined.state_source)
        say(f"[rank {joined.rank} of {joined.world_size}] joined the running job at step "
            f"{step} (it was at world {joined.previous_world_size})")
    it = batches(data, consumed, args.batch_size)
    # the launcher's rank: ranks are renumbered while the world is smaller
    victim = int(os.environ["RANK"]) == args.victim
    victim = victim and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
    whole_pending = admitted = joined is not None  # a joiner was admitted at this boundary
    mean = torch.zeros(())
    # a joiner does the step it was admitted at: the members chose to do it before then
    while admitted or step < args.steps or (dist.get_world_size() < full_world
                                            and not args.finish_short
                                            and step < 10 * args.steps):
        began = time.monotonic()
        if victim and step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            grown = None if admitted else dist.admit_joiners()  # once per step, every rank
            admitted = False
            if grown is not None:
                dist.broadcast_module_state(model, group_src=grown.state_source)
                ddp = ddp.rewrap()  # DDP's own broadcast from rank 0 then changes nothing
                dist.broadcast_optimizer_state(opt, group_src=grown.state_source)
                step, consumed = sync_counts(step, consumed, grown.state_source)
                it = batches(data, consumed, args.batch_size)
                say(f"[rank {grown.rank} of {grown.world_size}] admitted rank(s) "
                    f"{list(grown.joined_ranks)} at step {step}")
            x, y = next(it, (None, None))
            if x is None:  # a new epoch
                consumed, it = 0, batches(data, 0, args.batch_size)
                x, y = next(it)
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        except dist.DistError as exc:
            say(f"[rank {dist.get_rank()}] step {step}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0]}")
            shrunk = dist.shrink_on_failure(exc)
            ddp = ddp.rewrap()
            step, consumed = sync_counts(step, consumed)
            it = batches(data, consumed, args.batch_size)
            say(f"[rank {shrunk.rank} of {shrunk.world_size}] shrunk: lost rank(s) "
                f"{list(shrunk.lost_ranks)}; resuming at step {step}")
            continue
        consumed += args.batch_size * dist.get_world_size()
        step += 1
        first_loss = mean.item() if first_loss is None else first_loss
        if whole_pending:  # the replacement's first step completed at full world
            whole_pending = False
            say(f"[rank {dist.get_rank()}] world whole again ({dist.get_world_size()} ranks): "
                f"{time.time() - USER_CODE_AT:.2f} s after this replacement's user code began; "
                f"its Python and torch start-up took {USER_CODE_AT - process_start():.2f} s "
                f"before that")
        if dist.get_rank() == 0 and (step % 25 == 0 or step == 1):
            say(f"step {step:3d}  world {dist.get_world_size()}  loss {mean.item():.4f}")
        time.sleep(max(0.0, args.step_s - (time.monotonic() - began)))
    finish(model, full_world, step, first_loss, mean.item())


def finish(model: nn.Module, full_world: int, step: int, first_loss: float | None,
           last_loss: float) -> None:
    """Check that DDP kept the replicas equal and that the loss went down."""
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    replicas = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(replicas, flat)
    if dist.get_rank() == 0:
        world = dist.get_world_size()
        same = all(torch.equal(replicas[0], r) for r in replicas)
        say(f"finished {step} steps at world {world} (started at {full_world}); parameters "
            f"identical on all {world} ranks: {same}; loss {first_loss:.4f} -> "
            f"{last_loss:.4f}")
    dist.destroy_process_group()


def process_start() -> float:
    """When this process started (wall clock), from /proc: its Python and imports began then."""
    with open("/proc/self/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    ticks = os.sysconf("SC_CLK_TCK")
    return time.time() - uptime + int(fields[19]) / ticks


def say(line: str) -> None:
    """One write per line, so that the ranks' lines do not interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""Keep training when a rank dies: the survivors shrink the world and go on from memory.

Four ranks train a small regression model with DDP and ZeroRedundancyOptimizer (SGD with
momentum), each reading its share of the data through ElasticDistributedSampler. Part way
through, this script SIGKILLs one rank. The survivors' next collective raises PeerLostError;
each calls ``dist.shrink_on_failure``, re-wraps DDP and ZeRO on the new default group, makes a
sampler for the new world and carries on: no checkpoint, no restart.

    python examples/shrink_on_failure.py                     # 4 ranks, rank 1 killed at step 20
    python examples/shrink_on_failure.py --victim 0 --steps 60

The job's store runs in this launching process (``TORCHELASTIC_USE_AGENT_STORE=True``), not
in rank 0, so that any rank may die, rank 0 included: the survivors agree through the store on
who is gone (docs/recovery.md).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ringtorch.distributed as dist
from ringtorch.distributed.elastic.utils.data import ElasticDistributedSampler
from ringtorch.distributed.optim import ZeroRedundancyOptimizer
from ringtorch.nn.parallel import DistributedDataParallel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--victim", type=int, default=1, help="the rank to SIGKILL")
    parser.add_argument("--kill-at", type=int, default=20, help="kill it during this step")
    parser.add_argument("--steps", type=int, default=60, help="train this many steps")
    parser.add_argument("--batch-size", type=int, default=16, help="per rank")
    return parser.parse_args(argv)


def make_data(samples: int = 4096) -> TensorDataset:
    """y = x . w + noise, the same on every rank (seeded)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 8, generator=gen)
    w = torch.randn(8, 1, generator=gen)
    return TensorDataset(x, x @ w + 0.01 * torch.randn(samples, 1, generator=gen))


def batches(data: TensorDataset, world: int, rank: int, consumed: int, batch: int) -> Any:
    """This rank's batches of what is left of the epoch, for the current world."""
    sampler = ElasticDistributedSampler(data, num_replicas=world, rank=rank,
                                        start_index=consumed)
    return iter(DataLoader(data, batch_size=batch, sampler=sampler))


def train(rank: int, args: argparse.Namespace, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True")
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    store = dist.TCPStore("127.0.0.1", port, is_master=False)
    torch.manual_seed(0)
    data = make_data()
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    ddp = DistributedDataParallel(model)
    opt = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.SGD, lr=0.02, momentum=0.9)
    world, me = dist.get_world_size(), dist.get_rank()
    step, consumed, it = 0, 0, batches(data, world, me, 0, args.batch_size)
    recovering = False
    while step < args.steps:
        if rank == args.victim and step == args.kill_at:
            store.set("victim/pid", str(os.getpid()))  # the launcher kills this process now
            time.sleep(60)
        try:
            try:
                x, y = next(it)
            except StopIteration:  # a new epoch
                consumed, it = 0, batches(data, world, me, 0, args.batch_size)
                continue
            opt.zero_grad()
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        except dist.DistError as exc:
            say(f"[rank {me} of {world}] step {step}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0]}")
            shrunk = dist.shrink_on_failure(exc)
            ddp, opt = ddp.rewrap(), opt.rewrap()  # the parameters come from the new rank 0
            # the survivors may be a step apart: go on from rank 0's count, as its parameters
            counts = torch.tensor([step, consumed])
            dist.broadcast(counts, src=0)
            step, consumed = int(counts[0]), int(counts[1])
            world, me = shrunk.world_size, shrunk.rank
            it = batches(data, world, me, consumed, args.batch_size)
            say(f"[rank {me} of {world}] shrunk: lost ranks {list(shrunk.lost_ranks)}, was "
                f"rank {shrunk.previous_rank} of {shrunk.previous_world_size}; resuming at step "
                f"{step}")
            recovering = True
            continue
        consumed += args.batch_size * world
        step += 1
        if recovering and me == 0:  # the first step completed by the smaller world
            store.set("recovered/at", repr(time.time()))
        recovering = False
        if me == 0 and (step % 10 == 0 or step in (1, args.steps)):
            say(f"step {step:3d}  world {world}  loss {mean.item():.4f}")
    # DDP and ZeRO keep the replicas equal: check it across the survivors
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    replicas = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(replicas, flat)
    if me == 0:
        same = all(torch.equal(replicas[0], r) for r in replicas)
        say(f"finished {step} steps at world {world}; parameters identical on all {world} "
            f"ranks: {same}")
    dist.destroy_process_group()


def say(line: str) -> None:
    """One write per line, so that the ranks' lines do not interleave."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "ringtorch.distributed"])  # imported once, not 4 times
    procs = [ctx.Process(target=train, args=(r, args, store.port), name=f"rank{r}")
             for r in range(args.nproc)]
    for proc in procs:
        proc.start()
    store.wait(["victim/pid"], timedelta(seconds=120))
    killed_at = time.time()
    os.kill(int(store.get("victim/pid")), signal.SIGKILL)
    print(f"launcher: SIGKILLed rank {args.victim}", flush=True)
    store.wait(["recovered/at"], timedelta(seconds=120))
    print(f"launcher: the survivors completed a step at world {args.nproc - 1} "
          f"{float(store.get('recovered/at')) - killed_at:.2f} s after the kill", flush=True)
    for proc in procs:
        proc.join(120)
    codes = {p.name: p.exitcode for p in procs}
    print(f"launcher: exit codes {codes}", flush=True)
    survivors_ok = all(code == 0 for name, code in codes.items() if name != f"rank{args.victim}")
    return 0 if survivors_ok and codes[f"rank{args.victim}"] == -signal.SIGKILL else 1


if __name__ == "__main__":
    raise SystemExit(main())

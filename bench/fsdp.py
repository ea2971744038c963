"""FSDP2 training step on backend "ringtorch" against the same program on gloo, and against DDP.

    python bench/fsdp.py                          # worlds 2 and 4, 3 rounds of 10 steps
    python bench/fsdp.py --world-sizes 2 --rounds 1 --steps 3 --warmup 1
    python bench/fsdp.py --json bench/out/fsdp.json
    python bench/fsdp.py --world-sizes 2 --rounds 1 --profile    # where the step's time goes

The model is 8 x [Linear(1024, 1024) + ReLU] (8.4 M parameters), batch 16 per rank, SGD;
torch's FSDP2 shards each Linear with ``fully_shard`` and then the root. One job per world
size holds every configuration at once, and each round runs each configuration's steps in
turn, so that a change of the machine's load hits all of them alike:

* ``fsdp2 ringtorch``: torch's ``fully_shard`` on a mesh of torch's default group, backend
  "ringtorch" (``init_process_group("ringtorch")``, ``init_device_mesh("cpu", ...)``);
* ``fsdp2 gloo``: the same on a mesh of a gloo group of the same job;
* ``ddp ringtorch``: ringtorch's own DDP (``ringtorch.nn.parallel.DistributedDataParallel``
  on ``ringtorch.distributed``'s native backend): the anchor of the second target;
* ``ddp door``: torch's DDP on backend "ringtorch", for reference;
* ``compute``: the same steps with no communication (each rank its own full model): what an
  FSDP2 step costs before it talks; with ``comm`` below it says where the step's time goes.
* ``comm ringtorch`` / ``comm gloo``: the collectives FSDP2 issues per step, alone (per
  layer two all_gathers into the layer's 4 MB and one reduce_scatter of it, as
  ``all_gather_single`` and ``reduce_scatter_single``), on each
  backend.

A step's time is the slowest rank's; the table keeps each configuration's median step over
all rounds. Targets (ringtorch's goals): FSDP2 on ringtorch at most 0.5x gloo's step, and
at most 1.3x ringtorch's DDP step. One intra-op thread per rank.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _models import make_model  # bench/ is sys.path[0]
from _report import Recorder  # bench/ is sys.path[0]

WIDTH, LAYERS = 1024, 8
CONFIGS = ("fsdp2 ringtorch", "fsdp2 gloo", "ddp ringtorch", "ddp door", "compute",
           "comm ringtorch", "comm gloo")


def _model() -> Any:
    """8 x [Linear + ReLU]: make_model puts no ReLU after the last Linear, so add it."""
    import torch

    return torch.nn.Sequential(*make_model([WIDTH] * (LAYERS + 1)), torch.nn.ReLU())


def _fsdp(mesh: Any) -> Any:
    import torch
    from torch.distributed.fsdp import fully_shard

    model = _model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _comm_step(group: Any, world: int) -> Any:
    """FSDP2's collectives of one step on ``group``: per layer, all_gather the layer's flat
    parameters twice (forward, and again for backward) and reduce_scatter its gradients."""
    import torch
    import torch.distributed as dist

    numel = WIDTH * WIDTH + WIDTH
    shard = -(-numel // world)
    inp, full = torch.randn(shard), torch.empty(shard * world)
    grads, out = torch.randn(shard * world), torch.empty(shard)

    def step() -> None:
        for _ in range(LAYERS):
            dist.all_gather_single(full, inp, group=group)
            dist.all_gather_single(full, inp, group=group)
            dist.reduce_scatter_single(out, grads, group=group)

    return step


def run_rank(rank: int, world: int, rounds: int, steps: int, warmup: int,
             facade_port: int, profile: bool = False) -> dict[str, Any]:
    """Per-step seconds of each configuration on this rank, all rounds in a row; with
    ``profile``, rank 0 also returns cProfile's top functions over the FSDP2 steps of each
    backend (the calling thread only: the lane's thread is not seen)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    import ringtorch.distributed as rdist
    from ringtorch.nn.parallel import DistributedDataParallel as RingDDP

    torch.set_num_threads(1)
    dist.init_process_group("ringtorch")  # env://, as the harness sets it
    gloo = dist.new_group(backend="gloo")
    rdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{facade_port}", rank=rank,
                             world_size=world)
    models = {
        "fsdp2 ringtorch": _fsdp(init_device_mesh("cpu", (world,))),
        "fsdp2 gloo": _fsdp(DeviceMesh.from_group(gloo, "cpu")),
        "ddp ringtorch": RingDDP(_model()),
        "ddp door": torch.nn.parallel.DistributedDataParallel(_model()),
        "compute": _model(),
    }
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(16, WIDTH, generator=gen), torch.randn(16, WIDTH, generator=gen)

    def train(model: Any) -> Any:
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()

        return step

    calls = {name: train(model) for name, model in models.items()}
    calls["comm ringtorch"] = _comm_step(None, world)
    calls["comm gloo"] = _comm_step(gloo, world)
    times: dict[str, Any] = {name: [] for name in calls}
    profiles = {name: cProfile.Profile() for name in ("fsdp2 ringtorch", "fsdp2 gloo")}
    for round_ in range(rounds):
        for name, call in calls.items():
            for i in range(steps + (warmup if round_ == 0 else 0)):
                rdist.barrier()
                timed = round_ > 0 or i >= warmup
                prof = profiles.get(name) if profile and timed and rank == 0 else None
                start = time.perf_counter()
                if prof is not None:
                    prof.runcall(call)
                else:
                    call()
                if timed:
                    times[name].append(time.perf_counter() - start)
    if profile and rank == 0:
        for name, prof in profiles.items():
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
            times[f"profile {name}"] = text.getvalue()
    rdist.barrier()
    rdist.destroy_process_group()
    dist.destroy_process_group()
    return times


def measure(world: int, args: argparse.Namespace) -> dict[str, float]:
    """Each configuration's median step time (slowest rank) at ``world``."""
    from ringtorch.testing.harness import job_port, run_ranks

    per_rank = run_ranks(run_rank, world, timeout=1200,
                         args=(args.rounds, args.steps, args.warmup, job_port(), args.profile))
    for name, text in per_rank[0].items():
        if name.startswith("profile "):
            print(f"world {world}, rank 0, {name[8:]}, cProfile of the timed steps:\n{text}")
    n = len(per_rank[0]["compute"])
    return {name: statistics.median(max(r[name][i] for r in per_rank) for i in range(n))
            for name in CONFIGS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", action="store_true",
                        help="print cProfile's top functions of rank 0's FSDP2 steps (the "
                        "profiler slows them: the step times of such a run are not the bench's)")
    parser.add_argument("--json", type=Path,
                        help="also write the results here (bench/_report.py's format)")
    args = parser.parse_args(argv)
    recorder = Recorder("fsdp")
    print(f"FSDP2 step, {LAYERS} x [Linear({WIDTH}, {WIDTH}) + ReLU], batch 16/rank, SGD; "
          f"{args.rounds} rounds of {args.steps} steps, median of the slowest rank; 1 thread "
          f"per rank; load average before: {os.getloadavg()[0]:.2f}")
    rows = []
    for world in (int(w) for w in args.world_sizes.split(",")):
        ms = measure(world, args)
        row = {"world": world, **{name.replace(" ", "_") + "_s": ms[name] for name in CONFIGS}}
        row["vs_gloo"] = ms["fsdp2 ringtorch"] / ms["fsdp2 gloo"]
        row["vs_ddp"] = ms["fsdp2 ringtorch"] / ms["ddp ringtorch"]
        rows.append(row)
        print(f"world {world}:")
        for name in CONFIGS:
            print(f"  {name:18s} {ms[name] * 1e3:8.1f} ms")
        print(f"  fsdp2 ringtorch / fsdp2 gloo {row['vs_gloo']:.2f}x (target <= 0.5)   "
              f"fsdp2 ringtorch / ddp ringtorch {row['vs_ddp']:.2f}x (target <= 1.3)")
    # results: "rows", one per world size: world, <config>_s (median step seconds of each
    # configuration, spaces as underscores), vs_gloo and vs_ddp (the two targets' ratios)
    recorder.write(args.json, {"layers": LAYERS, "width": WIDTH, "batch": 16,
                               "rounds": args.rounds, "steps": args.steps, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())

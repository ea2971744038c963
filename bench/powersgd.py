"""PowerSGD against plain all-reduce under DDP: ringtorch and torch (gloo) side by side in one run.

For each world size, each implementation (torch's DDP with torch's hooks, ringtorch's DDP with
ringtorch's hooks) trains the same MLP with three communication hooks: ``allreduce_hook`` (the
same averaging as DDP without a hook), PowerSGD rank 1 and PowerSGD rank 4
(``start_powerSGD_iter=2``, error feedback and warm start on, so every timed step compresses).
Reported per configuration:

* step p50: the median over the timed steps of the slowest rank's step (forward, backward with
  the hook, SGD update);
* reduced/step: the bytes one rank hands to collectives per step (counted by wrapping
  ``dist.all_reduce`` in the rank, the call both packages' hooks make); a ring all-reduce puts
  ``2 (n-1)/n`` times that on each rank's link, shown as wire/step;
* ratios: bytes and step time against the same implementation's all-reduce, and ringtorch's step
  time against torch's for the same hook.

Run the full benchmark (25.2 M parameters, world sizes 2 and 4; several minutes on 2 cores):

    python bench/powersgd.py
    python bench/powersgd.py --rounds 3 --steps 20 --json bench/out/powersgd.json

A quick check that the script works (seconds):

    python bench/powersgd.py --widths 64 256 64 --steps 2 --warmup 3 --world-sizes 2

One intra-op thread per rank, so that the ranks do not fight over the cores.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _models import make_model  # bench/ is sys.path[0]
from torch import nn

from ringtorch.testing import run_ranks

HOOKS = {"allreduce": None, "powerSGD-r1": 1, "powerSGD-r4": 4}
# torch's DDP Reducer may hang when destroyed right after a PowerSGD hook ran on gloo: the
# models stay alive until the rank exits
_KEEP: list[Any] = []


def _count_bytes(dist: Any, counter: list[int]) -> None:
    """Wrap ``dist.all_reduce`` so that every tensor the hooks reduce is counted."""
    original = dist.all_reduce

    @functools.wraps(original)
    def counted(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        counter[0] += tensor.numel() * tensor.element_size()
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counted


# DDP objects live to the rank's exit: under torch, one freed after destroy_process_group can
# hang its process on the GIL (gloo's loop thread)
_KEEP: list[Any] = []

def rank_main(rank: int, world_size: int, package: str, hook: str, widths: list[int],
              batch: int, steps: int, warmup: int, bucket_cap_mb: float) -> dict[str, Any]:
    torch.set_num_threads(1)
    dist = importlib.import_module(f"{package}.distributed")
    hooks = f"{package}.distributed.algorithms.ddp_comm_hooks"
    default = importlib.import_module(f"{hooks}.default_hooks")
    power = importlib.import_module(f"{hooks}.powerSGD_hook")
    ddp_class = importlib.import_module(f"{package}.nn.parallel").DistributedDataParallel
    dist.init_process_group("gloo", world_size=world_size)
    model = make_model(widths)
    ddp = ddp_class(model, bucket_cap_mb=bucket_cap_mb)
    if HOOKS[hook] is None:
        ddp.register_comm_hook(None, default.allreduce_hook)
    else:
        state = power.PowerSGDState(None, matrix_approximation_rank=HOOKS[hook],
                                    start_powerSGD_iter=2)
        ddp.register_comm_hook(state, power.powerSGD_hook)
    counter = [0]
    _count_bytes(dist, counter)
    params = list(model.parameters())
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, widths[0], generator=g)
    y = torch.randn(batch, widths[-1], generator=g)
    times, nbytes = [], []
    for step in range(warmup + steps):
        dist.barrier()
        counter[0] = 0
        start = time.perf_counter()
        for p in params:
            p.grad = None
        nn.functional.mse_loss(ddp(x), y).backward()
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-1e-3)
        if step >= warmup:
            times.append(time.perf_counter() - start)
            nbytes.append(counter[0])
    _KEEP.append(ddp)
    _KEEP.append(ddp)  # freed after destroy_process_group, torch's can hang on the GIL
    dist.destroy_process_group()
    return {"times": times, "bytes": nbytes}


def measure(package: str, hook: str, world_size: int, args: argparse.Namespace
            ) -> dict[str, Any]:
    results = run_ranks(rank_main, world_size, timeout=600,
                        args=(package, hook, args.widths, args.batch, args.steps, args.warmup,
                              args.bucket_cap_mb))
    step_times = [max(r["times"][i] for r in results) for i in range(args.steps)]
    reduced = statistics.median(results[0]["bytes"])
    return {"package": package, "hook": hook, "world_size": world_size,
            "step_p50_s": statistics.median(step_times), "reduced_bytes": reduced,
            "wire_bytes": reduced * 2 * (world_size - 1) / world_size}


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(rows, key=lambda r: r["step_p50_s"])[len(rows) // 2]


def _mib(nbytes: float) -> str:
    """Bytes in the largest binary unit that keeps the number at least 1."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f}{unit}"
    return f"{nbytes:.0f}B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[1024, 4096, 4096, 1024])
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1, help="each configuration runs this often")
    parser.add_argument("--warmup", type=int, default=3, help="at least 2: PowerSGD starts at 2")
    parser.add_argument("--bucket-cap-mb", type=float, default=128.0,
                        help="DDP's bucket size; the default makes the default model one "
                             "bucket: torch's PowerSGD hook starts its collectives from "
                             "callbacks, which with several buckets can pair different "
                             "collectives across ranks and hang on gloo")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    if args.warmup < 2:
        parser.error("--warmup must be at least 2 so that every timed step compresses")

    n_params = sum(p.numel() for p in make_model(args.widths).parameters())
    print(f"model: MLP {'-'.join(map(str, args.widths))} ({n_params / 1e6:.2f} M params), "
          f"batch {args.batch}/rank, {args.rounds} round(s) of {args.steps} timed steps, "
          f"1 thread per rank; load average before: {os.getloadavg()[0]:.2f}")
    configs = [(pkg, hook, ws) for ws in args.world_sizes for hook in HOOKS
               for pkg in ("torch", "ringtorch")]
    # the configurations take turns, so that a change in the machine's load hits all of them
    rounds = [[measure(pkg, hook, ws, args) for pkg, hook, ws in configs]
              for _ in range(args.rounds)]
    rows = [_median_row([r[i] for r in rounds]) for i in range(len(configs))]
    base = {(r["package"], r["world_size"]): r for r in rows if r["hook"] == "allreduce"}
    by_key = {(r["package"], r["hook"], r["world_size"]): r for r in rows}
    print(f"{'configuration':<30}{'step p50':>11}{'reduced/step':>14}{'wire/step':>12}"
          f"{'bytes vs AR':>13}{'time vs AR':>12}{'time rt/torch':>15}")
    for row in rows:
        ref = base[(row["package"], row["world_size"])]
        row["bytes_vs_allreduce"] = row["reduced_bytes"] / ref["reduced_bytes"]
        row["time_vs_allreduce"] = row["step_p50_s"] / ref["step_p50_s"]
        torch_row = by_key[("torch", row["hook"], row["world_size"])]
        row["time_vs_torch"] = row["step_p50_s"] / torch_row["step_p50_s"]
        name = f"{row['package']} {row['hook']} x{row['world_size']}"
        versus = f"{row['time_vs_torch']:.2f}x" if row["package"] == "ringtorch" else "-"
        print(f"{name:<30}{row['step_p50_s'] * 1e3:>9.1f}ms{_mib(row['reduced_bytes']):>14}"
              f"{_mib(row['wire_bytes']):>12}{row['bytes_vs_allreduce']:>13.3f}"
              f"{row['time_vs_allreduce']:>12.2f}{versus:>15}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

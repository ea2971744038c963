"""ZeroRedundancyOptimizer vs plain Adam under DDP: memory per rank and step time, torch and ringtorch.

Each configuration (stack torch or ringtorch, optimizer plain Adam or ZeroRedundancyOptimizer
wrapping Adam, world size) trains the same MLP under its stack's DDP (gloo for torch). Reported
per configuration, as the worst rank:

* optimizer state: bytes of the tensors in the optimizer's state held by the rank (for ZeRO,
  its local optimizer's: about 1/world_size of Adam's two moments);
* peak RSS: the rank process's high-water resident memory (``ru_maxrss``), imports included;
* step p50: median over the timed steps of the slowest rank's forward + backward + step;
* ratios: ZeRO / Adam within a stack, and ringtorch / torch for the same optimizer.

Full run (takes minutes; run it on a quiet machine):

    python bench/zero.py                     # MLP of 8 1024x1024 layers (8.4 M params), worlds 2 and 4
    python bench/zero.py --bucket-view --json bench/out/zero.json

Quick check that the script works:

    python bench/zero.py --widths 64 128 64 --steps 2 --warmup 1 --worlds 2

Parameters are not split between ranks (torch's partition, parameter by parameter), so the
state a rank holds is ~1/world_size only when no parameter is a large part of the model: the
default model has eight equal layers for that reason.

One intra-op thread per rank, so that the ranks do not fight over the cores.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _models import make_model  # bench/ is sys.path[0]
from torch import nn

from ringtorch.testing import run_ranks


def _state_nbytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(t.numel() * t.element_size() for state in optimizer.state.values()
               for t in state.values() if torch.is_tensor(t))


def rank_main(rank: int, world_size: int, stack: str, zero: bool, widths: list[int],
              batch: int, steps: int, warmup: int, bucket_view: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    if stack == "torch":
        import torch.distributed as dist
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel
    else:
        import ringtorch.distributed as dist
        from ringtorch.distributed.optim import ZeroRedundancyOptimizer
        from ringtorch.nn.parallel import DistributedDataParallel
    dist.init_process_group("gloo", world_size=world_size)
    model = DistributedDataParallel(make_model(widths))
    if zero:
        optimizer = ZeroRedundancyOptimizer(model.parameters(), torch.optim.Adam, lr=1e-4,
                                            parameters_as_bucket_view=bucket_view)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, widths[0], generator=g)
    y = torch.randn(batch, widths[-1], generator=g)
    times = []
    for step in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    result = {"times": times,
              "state_nbytes": _state_nbytes(optimizer.optim if zero else optimizer),
              "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    # torch's gloo can hang freeing a DDP whose peers already left: free it while all are here
    del model, optimizer
    dist.barrier()
    dist.destroy_process_group()
    return result


def measure(stack: str, zero: bool, world_size: int, args: argparse.Namespace) -> dict[str, Any]:
    results = run_ranks(rank_main, world_size, timeout=600,
                        args=(stack, zero, args.widths, args.batch, args.steps, args.warmup,
                              args.bucket_view))
    step_times = [max(r["times"][i] for r in results) for i in range(args.steps)]
    return {"stack": stack, "optimizer": "zero" if zero else "adam", "world_size": world_size,
            "step_p50_s": statistics.median(step_times),
            "state_nbytes": max(r["state_nbytes"] for r in results),
            "peak_rss_bytes": max(r["peak_rss_bytes"] for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[1024] * 9)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--bucket-view", action="store_true",
                        help="ZeroRedundancyOptimizer(parameters_as_bucket_view=True)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    n_params = sum(p.numel() for p in make_model(args.widths).parameters())
    print(f"model: MLP {'-'.join(map(str, args.widths))} ({n_params / 1e6:.2f} M params; "
          f"Adam state {n_params * 8 / 2**20:.1f} MiB unsharded), batch {args.batch}/rank, "
          f"{args.steps} timed steps, parameters_as_bucket_view={args.bucket_view}")
    rows = {(stack, opt, ws): measure(stack, opt == "zero", ws, args)
            for ws in args.worlds for opt in ("adam", "zero") for stack in ("torch", "ringtorch")}
    print(f"{'world':>5} {'optimizer':<9} {'stack':<9}{'state/rank':>12}{'peak RSS':>11}"
          f"{'step p50':>11}{'ZeRO/Adam state':>17}{'ZeRO/Adam step':>16}{'ours/torch step':>17}")
    for (stack, opt, ws), row in rows.items():
        adam = rows[(stack, "adam", ws)]
        torch_row = rows[("torch", opt, ws)]
        row["zero_over_adam_state"] = row["state_nbytes"] / max(adam["state_nbytes"], 1)
        row["zero_over_adam_step"] = row["step_p50_s"] / adam["step_p50_s"]
        row["ringtorch_over_torch_step"] = row["step_p50_s"] / torch_row["step_p50_s"]
        print(f"{ws:>5} {opt:<9} {stack:<9}{row['state_nbytes'] / 2**20:>10.2f}Mi"
              f"{row['peak_rss_bytes'] / 2**20:>9.0f}Mi{row['step_p50_s'] * 1e3:>9.1f}ms"
              f"{row['zero_over_adam_state']:>17.2f}{row['zero_over_adam_step']:>16.2f}"
              f"{row['ringtorch_over_torch_step'] if stack == 'ringtorch' else 1.0:>17.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "rows": list(rows.values())}, indent=2))


if __name__ == "__main__":
    main()

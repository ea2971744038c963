"""DDP training throughput: ringtorch's DDP against torch's DDP (gloo), side by side in one run.

Same model, data, optimizer and world size for both; one process alone gives the baseline.
For each configuration the ranks run warm-up steps, then timed steps (forward, backward,
SGD step); a step's time is the slowest rank's. Reported per configuration:

* samples/s: world_size * batch / median step time;
* weak-scaling efficiency: samples/s / (world_size * single-process samples/s);
* vs no-comm: the step time of world_size processes training alone, without DDP, divided by
  this configuration's: what DDP costs once the ranks' competition for the cores is set
  aside (on a busy 2-core machine two processes are slower than one even without talking);
* exposed communication: median DDP step time minus median single-process step time, i.e. the
  communication not hidden behind backward (plus DDP's own overhead);
* for ringtorch also the time backward waits for the buckets at its end, measured in the reducer;
* CPU/step: CPU time of one rank's process (all its threads) per step, median, slowest rank:
  what the step costs the machine, and much less sensitive to other load than wall time.

    python bench/ddp.py                      # MLP 1024-4096-4096-1024 (25.2 M params), batch 32
    python bench/ddp.py --rounds 5 --steps 40 --json bench/out/ddp.json
    python bench/ddp.py --bucket-view        # both DDPs with gradient_as_bucket_view=True

The default model and batch are those of reference/PERFORMANCE.md section 2.6 (torch gloo:
0.54 weak-scaling efficiency on 2 cores). One intra-op thread per rank, so that the ranks do
not fight over the cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _models import make_model  # bench/ is sys.path[0]
from _report import Recorder  # bench/ is sys.path[0]
from torch import nn

from ringtorch.testing import run_ranks


def _wrap(impl: str, model: nn.Module, bucket_cap_mb: float | None, bucket_view: bool
          ) -> tuple[nn.Module, Any]:
    """The model wrapped in the implementation's DDP, and a list to collect bucket waits."""
    waits: list[float] = []
    options = {"bucket_cap_mb": bucket_cap_mb, "gradient_as_bucket_view": bucket_view}
    if impl in ("single", "independent"):
        return model, waits
    if impl == "torch":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, **options), waits
    from ringtorch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(model, **options)
    reducer = ddp.reducer
    finalize = reducer._finalize_backward

    def timed_finalize() -> None:
        start = time.perf_counter()
        finalize()
        waits.append(time.perf_counter() - start)

    reducer._finalize_backward = timed_finalize
    return ddp, waits


def rank_main(rank: int, world_size: int, impl: str, widths: list[int], batch: int, steps: int,
              warmup: int, bucket_cap_mb: float | None, bucket_view: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    dist: Any = None
    if impl == "torch":
        import torch.distributed as dist
    elif impl in ("ringtorch", "independent"):
        from ringtorch import distributed as dist  # independent: only for the step barrier
    if dist is not None:
        dist.init_process_group("gloo", world_size=world_size)
    model, waits = _wrap(impl, make_model(widths), bucket_cap_mb, bucket_view)
    params = list(model.parameters())
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(batch, widths[0], generator=g)
    y = torch.randn(batch, widths[-1], generator=g)
    times, cpu = [], []
    for step in range(warmup + steps):
        if dist is not None:
            dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        for p in params:
            if bucket_view and p.grad is not None:
                p.grad.zero_()  # zero_grad(set_to_none=False): the grads stay bucket views
            else:
                p.grad = None
        nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-1e-3)
        if step >= warmup:
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)  # every thread of the rank
    if dist is not None:
        dist.destroy_process_group()
    return {"times": times, "cpu": cpu, "waits": waits[warmup:]}


def measure(impl: str, world_size: int, args: argparse.Namespace) -> dict[str, Any]:
    results = run_ranks(rank_main, world_size, timeout=600,
                        args=(impl, args.widths, args.batch, args.steps, args.warmup,
                              args.bucket_cap_mb, args.bucket_view))
    step_times = [max(r["times"][i] for r in results) for i in range(args.steps)]
    median = statistics.median(step_times)
    waits = results[0]["waits"]
    cpu = max(statistics.median(r["cpu"]) for r in results)
    return {"impl": impl, "world_size": world_size, "step_p50_s": median, "cpu_per_step_s": cpu,
            "samples_per_s": world_size * args.batch / median,
            "bucket_wait_p50_s": statistics.median(waits) if waits else None}


def _median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The round whose median step time is the median over the rounds."""
    return sorted(rows, key=lambda r: r["step_p50_s"])[len(rows) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[1024, 4096, 4096, 1024])
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="each configuration runs this often")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bucket-cap-mb", type=float, default=None)
    parser.add_argument("--bucket-view", action="store_true",
                        help="gradient_as_bucket_view=True for both DDPs, grads zeroed in place")
    parser.add_argument("--json", type=Path,
                        help="also write the results here (bench/_report.py's format)")
    args = parser.parse_args()
    recorder = Recorder("ddp")

    n_params = sum(p.numel() for p in make_model(args.widths).parameters())
    print(f"model: MLP {'-'.join(map(str, args.widths))} ({n_params / 1e6:.1f} M params, "
          f"{n_params * 4 / 2**20:.0f} MiB of gradients), batch {args.batch}/rank, "
          f"{args.rounds} rounds of {args.steps} timed steps, world size {args.world_size}, "
          f"1 thread per rank, gradient_as_bucket_view={args.bucket_view}; "
          f"load average before: {os.getloadavg()[0]:.2f}")
    # the configurations take turns, so that a change in the machine's load hits all of them
    configs = [("single", 1), ("independent", args.world_size), ("torch", args.world_size),
               ("ringtorch", args.world_size)]
    rounds = [[measure(impl, ws, args) for impl, ws in configs] for _ in range(args.rounds)]
    rows = [_median_row([r[i] for r in rounds]) for i in range(len(configs))]
    single, independent = rows[0], rows[1]
    print(f"{'configuration':<26}{'step p50':>10}{'samples/s':>11}{'efficiency':>12}"
          f"{'vs no-comm':>12}{'exposed comm':>14}{'bucket wait':>13}{'CPU/step':>10}")
    for row in rows:
        row["efficiency"] = row["samples_per_s"] / (row["world_size"] * single["samples_per_s"])
        row["vs_independent"] = independent["step_p50_s"] / row["step_p50_s"]
        row["exposed_comm_s"] = row["step_p50_s"] - single["step_p50_s"]
        wait = row["bucket_wait_p50_s"]
        name = {"single": "one process",
                "independent": f"{row['world_size']} processes, no comm"}.get(
            row["impl"], f"{row['impl']} DDP x{row['world_size']}")
        print(f"{name:<26}{row['step_p50_s'] * 1e3:>8.1f}ms{row['samples_per_s']:>11.1f}"
              f"{row['efficiency']:>12.2f}{row['vs_independent']:>12.2f}"
              f"{row['exposed_comm_s'] * 1e3:>12.1f}ms"
              f"{'-' if wait is None else f'{wait * 1e3:.1f}ms':>13}"
              f"{row['cpu_per_step_s'] * 1e3:>8.1f}ms")
    ratio = rows[3]["samples_per_s"] / rows[2]["samples_per_s"]
    print(f"ringtorch / torch throughput: {ratio:.2f}x")
    # results: the model and settings, "rows" (one per configuration: impl, world_size,
    # step_p50_s, samples_per_s, efficiency, vs_independent, exposed_comm_s,
    # bucket_wait_p50_s, cpu_per_step_s) and "ratio" (ringtorch / torch samples/s)
    recorder.write(args.json, {"widths": args.widths, "params": n_params, "batch": args.batch,
                               "world_size": args.world_size, "rounds": args.rounds,
                               "steps": args.steps, "bucket_view": args.bucket_view,
                               "rows": rows, "ratio": ratio})


if __name__ == "__main__":
    main()

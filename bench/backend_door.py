"""The backend door's cost per call: a small all_reduce through torch.distributed on backend
"ringtorch" against the same call through ringtorch.distributed, and torch's gloo, in one run.

    python bench/backend_door.py                      # world 2, 1 KB float32, 7 rounds
    python bench/backend_door.py --bytes 65536 --rounds 11

One job of --world-size processes holds three groups at once: the facade's default group
(``ringtorch.distributed.init_process_group("gloo")``: ringtorch's native backend), torch's
default group on backend "ringtorch" (the door: torch's Python code, then the engine), and a
gloo group. Each round times --iters synchronous all_reduces on each in turn, so that the
three see the same machine; a round's time per call is the slowest rank's mean, and the
table keeps each library's median over rounds. ``door/facade`` is the door's cost factor
(goal: at most 1.5).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any


def run_rank(rank: int, world_size: int, numel: int, rounds: int, iters: int,
             facade_port: int) -> dict[str, list[float]]:
    """Per-call seconds of each library, one entry per round."""
    import torch
    import torch.distributed as dist

    import ringtorch.distributed as rdist

    torch.set_num_threads(1)
    dist.init_process_group("ringtorch")  # env://, as the harness sets it
    gloo = dist.new_group(backend="gloo")
    rdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{facade_port}", rank=rank,
                             world_size=world_size)
    calls: dict[str, Any] = {
        "door": lambda t: dist.all_reduce(t),
        "facade": lambda t: rdist.all_reduce(t),
        "gloo": lambda t: dist.all_reduce(t, group=gloo),
    }
    tensor = torch.ones(numel)
    for name, call in calls.items():  # warm up, and check the sum once
        tensor.fill_(1.0)
        call(tensor)
        if tensor[0].item() != world_size:
            raise AssertionError(f"{name} all_reduce gave {tensor[0].item()} on rank {rank}")
        for _ in range(iters):
            call(tensor)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            rdist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                call(tensor)
            times[name].append((time.perf_counter() - start) / iters)
    rdist.barrier()
    rdist.destroy_process_group()
    dist.destroy_process_group()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--bytes", type=int, default=1024, help="float32 tensor size")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=500)
    args = parser.parse_args(argv)
    from ringtorch.testing.harness import job_port, run_ranks

    per_rank = run_ranks(run_rank, args.world_size, timeout=600,
                         args=(args.bytes // 4, args.rounds, args.iters, job_port()))
    medians = {name: statistics.median(max(r[name][i] for r in per_rank)
                                       for i in range(args.rounds))
               for name in per_rank[0]}
    print(f"all_reduce of {args.bytes} B float32, world {args.world_size}, median over "
          f"{args.rounds} rounds of {args.iters} calls (slowest rank)")
    for name, label in (("door", 'torch.distributed, backend "ringtorch"'),
                        ("facade", "ringtorch.distributed"), ("gloo", "torch gloo")):
        print(f"  {label:40s} {medians[name] * 1e6:9.1f} us")
    print(f"  door/facade {medians['door'] / medians['facade']:.2f}x   "
          f"gloo/door {medians['gloo'] / medians['door']:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

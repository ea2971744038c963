"""DTensor redistribute Shard(0) -> Replicate on backend "ringtorch" against gloo, in one run.

    python bench/dtensor.py                       # world 2, 4 MB float32, 7 rounds
    python bench/dtensor.py --bytes 65536 --world-size 4

One job holds two 1-D meshes over the same ranks: one of torch's default group, backend
"ringtorch" (``init_process_group("ringtorch")``, ``init_device_mesh("cpu", ...)``), one of a
gloo group (``DeviceMesh.from_group``). A tensor of --bytes, sharded on dim 0, is
redistributed to Replicate (an all_gather under DTensor) --iters times on each mesh in turn;
a round's time per call is the slowest rank's mean and the table keeps the median over
rounds. Target (ringtorch's goal): at least 3x gloo's speed for 4 MB at world 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _report import Recorder  # bench/ is sys.path[0]


def run_rank(rank: int, world: int, numel: int, rounds: int, iters: int
             ) -> dict[str, list[float]]:
    """Per-call seconds of each backend, one entry per round."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.set_num_threads(1)
    dist.init_process_group("ringtorch")  # env://, as the harness sets it
    gloo = dist.new_group(backend="gloo")
    meshes = {"ringtorch": init_device_mesh("cpu", (world,)),
              "gloo": DeviceMesh.from_group(gloo, "cpu")}
    full = torch.arange(numel, dtype=torch.float32)
    sharded = {name: distribute_tensor(full, mesh, [Shard(0)]) for name, mesh in meshes.items()}
    for name, dt in sharded.items():  # warm up, and check the result once
        got = dt.redistribute(dt.device_mesh, [Replicate()]).to_local()
        if not torch.equal(got, full):
            raise AssertionError(f"{name}: Shard(0) -> Replicate is not the full tensor")
    times: dict[str, list[float]] = {name: [] for name in sharded}
    for _ in range(rounds):
        for name, dt in sharded.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                dt.redistribute(dt.device_mesh, [Replicate()]).to_local()
            times[name].append((time.perf_counter() - start) / iters)
    dist.barrier()
    dist.destroy_process_group()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--bytes", type=int, default=4 * 1024 * 1024, help="float32 tensor")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", type=Path,
                        help="also write the results here (bench/_report.py's format)")
    args = parser.parse_args(argv)
    from ringtorch.testing.harness import run_ranks

    recorder = Recorder("dtensor")
    per_rank: list[Any] = run_ranks(run_rank, args.world_size, timeout=600,
                                    args=(args.bytes // 4, args.rounds, args.iters))
    medians = {name: statistics.median(max(r[name][i] for r in per_rank)
                                       for i in range(args.rounds))
               for name in per_rank[0]}
    ratio = medians["gloo"] / medians["ringtorch"]
    print(f"DTensor redistribute Shard(0) -> Replicate of {args.bytes} B float32, world "
          f"{args.world_size}, median over {args.rounds} rounds of {args.iters} calls "
          f"(slowest rank)")
    for name in ("ringtorch", "gloo"):
        print(f"  {name:10s} {medians[name] * 1e6:10.1f} us")
    print(f"  gloo / ringtorch {ratio:.2f}x (target >= 3)")
    # results: world, bytes, ringtorch_s and gloo_s (median seconds per redistribute), ratio
    recorder.write(args.json, {"world": args.world_size, "bytes": args.bytes,
                               "rounds": args.rounds, "iters": args.iters,
                               "ringtorch_s": medians["ringtorch"], "gloo_s": medians["gloo"],
                               "ratio": ratio})
    return 0


if __name__ == "__main__":
    sys.exit(main())

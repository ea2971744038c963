"""all_reduce on device tensors at world 2 on ONE GPU: ringtorch's IPC and staged paths vs torch's gloo.

    python bench/gpu.py                    # float32, 1K..256M (every power of 4), cuda:0
    python bench/gpu.py --quick            # 1K, 64K, 1M, 16M, 64M, 256M, few iterations (< 2 min)
    python bench/gpu.py --dry              # the simulated runtime, tiny sizes (a CPU machine)
    python bench/gpu.py --json bench/out/gpu.json   # also bench/_report.py's JSON

Both ranks run on cuda:0 (the GPU check's machine has one GPU). ``ipc`` is
ringtorch.distributed with backend "gloo" (its native one) on CUDA tensors over the IPC path
(device buffers exported between the ranks, reduced on the device); ``staging`` the same with
that path off (RINGTORCH_DEVICE_IPC=0), staged through pinned host memory in stream order
(both opened with RINGTORCH_DEVICE_UNCONFIRMED=1, as the GPU check does); ``gloo`` is
torch.distributed's gloo on the same CUDA tensors. Each library runs in
its own world of processes. A timed call follows a barrier and ends when the calling stream has
drained (the result is on the device); an iteration's time is the slowest rank's, a cell's the
median over iterations. Bus bandwidth is nccl-tests' (size x 2(n-1)/n / time); each ratio is
gloo's time over the path's (its speed-up: > 1, ringtorch is faster). The first call of every size is checked
for the right sum.

Dry run (``--dry``, or RINGTORCH_DEVICE_RUNTIME=sim as GPU_CHECK_DRY=1 sets, or no CUDA):
ringtorch's paths run on the simulated runtime's device tensors and gloo on CPU tensors, at 1K and
64K only: it checks the plumbing in seconds; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

from _report import Recorder  # bench/ is sys.path[0]
from _sizes import busbw_factor, human, parse_sizes

QUICK = "1K,64K,1M,16M,64M,256M"
DRY = "1K,64K"
LIBS = ("ipc", "staging", "gloo")
WORLD = 2


def iterations(nbytes: int, quick: bool) -> tuple[int, int]:
    """(warm-up, timed) calls: many for small sizes, a few for the largest."""
    most = 20 if quick else 200
    timed = max(3, min(most, int((5e7 if quick else 5e8) / max(nbytes, 1))))
    return (1 if quick else 3), timed


# -- one rank ----------------------------------------------------------------------------------


def run_rank(rank: int, world_size: int, lib: str, sizes: list[int], port: int, dry: bool,
             quick: bool) -> dict[int, list[float]]:
    """Time all_reduce at each size; returns {bytes: [seconds per timed call]}."""
    import warnings

    import torch

    warnings.simplefilter("ignore", FutureWarning)
    if lib != "gloo":
        import ringtorch.distributed as dist
        from ringtorch import _device

        rt: Any = _device.runtime()
    else:
        import torch.distributed as dist

        rt = None
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=120))

    def make(numel: int) -> torch.Tensor:
        if rt is not None:
            t = rt.empty((numel,), torch.float32, 0)
            rt.launch(rt.current_stream(0), lambda: t.fill_(rank + 1.0))
            return t
        device = "cpu" if dry else "cuda:0"
        return torch.full((numel,), rank + 1.0, dtype=torch.float32, device=device)

    def drain() -> None:  # the call is done when the calling stream has the result
        if rt is not None:
            rt.current_stream(0).synchronize()
        elif not dry:
            torch.cuda.current_stream().synchronize()

    times: dict[int, list[float]] = {}
    for nbytes in sizes:
        t = make(nbytes // 4)
        warm, timed = iterations(nbytes, quick)
        dist.all_reduce(t)
        drain()
        expected = float(sum(r + 1 for r in range(world_size)))
        got = t.to("cpu") if rt is None else _host(rt, t)
        if not bool((got == expected).all()):
            raise AssertionError(f"{lib} all_reduce of {human(nbytes)}: expected {expected}, "
                                 f"got {got[:4].tolist()}...")
        if lib != "gloo":  # the path measured is the one named
            from ringtorch.distributed import _device_ipc

            paths = set(_device_ipc._state.paths.values())
            if paths != {"ipc" if lib == "ipc" else "staging"}:
                raise AssertionError(f"{lib}: all_reduce took the path(s) {sorted(paths)}")
        for _ in range(warm):
            dist.all_reduce(t)
        drain()
        out = []
        for _ in range(timed):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(t)
            drain()
            out.append(time.perf_counter() - start)
        times[nbytes] = out
        del t
    dist.destroy_process_group()
    return times


def _host(rt: Any, t: Any) -> Any:
    import torch

    out = torch.empty(t.shape, dtype=t.dtype)
    stream = rt.current_stream(0)
    rt.launch(stream, lambda: out.copy_(t))
    stream.synchronize()
    return out


# -- driver ------------------------------------------------------------------------------------


def run_world(lib: str, args: argparse.Namespace) -> dict[int, float]:
    from ringtorch.testing.harness import job_port, run_ranks

    env = {"RINGTORCH_DEVICE_UNCONFIRMED": "1", "RINGTORCH_DEVICE_IPC": str(int(lib == "ipc"))}
    if args.dry:
        env["RINGTORCH_DEVICE_RUNTIME"] = "sim"
    per_rank = run_ranks(run_rank, WORLD, timeout=args.timeout, env=env,
                         args=(lib, args.sizes, job_port(), args.dry, args.quick))
    return {n: statistics.median(max(s) for s in zip(*(r[n] for r in per_rank), strict=True))
            for n in args.sizes}


def report(results: dict[str, dict[int, float]], args: argparse.Namespace) -> str:
    where = ("the simulated runtime (ringtorch) and CPU tensors (gloo): plumbing only"
             if args.dry else "both ranks on cuda:0")
    factor = busbw_factor("all_reduce", WORLD)
    lines = [f"all_reduce float32, world {WORLD}, {where}; median time per call (us), bus "
             f"bandwidth (GB/s: size x {factor:g} / time), x = gloo's time / the path's",
             f"{'size':>6} " + " ".join(f"{lib + ' us':>12} {'GB/s':>7}" for lib in LIBS)
             + f" {'ipc x':>7} {'staging x':>9}"]
    for n in args.sizes:
        cells = " ".join(f"{results[lib][n] * 1e6:>12.1f} {n * factor / results[lib][n] / 1e9:>7.2f}"
                         for lib in LIBS)
        gloo = results["gloo"][n]
        lines.append(f"{human(n):>6} {cells} {gloo / results['ipc'][n]:>7.2f} "
                     f"{gloo / results['staging'][n]:>9.2f}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help=f"sizes {QUICK}, few iterations")
    p.add_argument("--dry", action="store_true",
                   help="the simulated runtime and tiny sizes (also when "
                        "RINGTORCH_DEVICE_RUNTIME=sim or torch sees no GPU)")
    p.add_argument("--sizes", default=None, help="e.g. 1K..256M or 1K,1M (bytes)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per world")
    p.add_argument("--json", default=None, help="also write bench/_report.py's JSON here")
    args = p.parse_args(argv)
    if not args.dry:
        args.dry = os.environ.get("RINGTORCH_DEVICE_RUNTIME") == "sim" or not _has_gpu()
    if args.sizes is None:
        args.sizes = DRY if args.dry else QUICK if args.quick else "1K..256M"
    args.sizes = parse_sizes(args.sizes)
    return args


def _has_gpu() -> bool:
    # counted without initialising CUDA in this process (the ranks do that themselves)
    import torch

    from ringtorch.launcher.config import visible_gpu_count

    return torch.backends.cuda.is_built() and visible_gpu_count() > 0


def main() -> int:
    args = parse_args()
    recorder = Recorder("gpu")
    start = time.monotonic()
    results = {}
    for lib in LIBS:  # each world's medians as it ends: a check cut short keeps them
        results[lib] = run_world(lib, args)
        print(f"{lib}: " + ", ".join(f"{human(n)} {s * 1e6:.1f} us"
                                     for n, s in results[lib].items()), flush=True)
    print(report(results, args))
    print(f"total {time.monotonic() - start:.1f} s")
    recorder.write(args.json, {"world_size": WORLD, "dry": args.dry, "sizes": args.sizes,
                               "seconds": {lib: {str(n): s for n, s in r.items()}
                                           for lib, r in results.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())

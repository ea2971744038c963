"""What ringtorch's MPI backend costs over calling mpi4py directly, side by side in one run.

    python bench/mpi_overhead.py                 # starts itself under `mpirun -n 2`
    python bench/mpi_overhead.py --world-size 4 --ops all_reduce --max-bytes 16M
    mpirun -n 2 python bench/mpi_overhead.py     # or start it yourself
    python bench/mpi_overhead.py --json bench/out/mpi.json   # also bench/_report.py's JSON

For each size, every variant runs the same operation on the same buffer, in turns (raw, ours,
raw, ours, ...), with a barrier before each timed call, and rank 0 prints the medians:

  raw      mpi4py's buffer method on a NumPy array (Allreduce(IN_PLACE, a), Bcast, Allgather)
  backend  MpiBackend on a torch tensor, with the agreement check (RINGTORCH_MPI_CHECK=1, default)
  nocheck  MpiBackend without the agreement check
  facade   ringtorch.distributed on the "mpi" backend (when the facade can make one)

The ratio columns are variant / raw; the MPI backend's target is at most 1.20 from 1 MB up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from _report import Recorder  # bench/ is sys.path[0]

SIZES = ["1K", "16K", "256K", "1M", "4M", "16M", "64M"]


def _nbytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def _relaunch(args: argparse.Namespace) -> int:
    """Not started by an MPI launcher: start this script again under mpirun."""
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    if mpirun is None:
        sys.exit("mpirun not found: pip install 'ringtorch[mpi]'")
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
    extra = ["--oversubscribe"] if "Open MPI" in version or "prte" in version.lower() else []
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [mpirun, *extra, "-n", str(args.world_size), sys.executable, __file__, *sys.argv[1:]]
    return subprocess.call(cmd, env=env)


def _timed(fn: Callable[[], None], barrier: Callable[[], None]) -> float:
    barrier()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _variants(op: str, nbytes: int, comm, backends: dict, facade) -> dict[str, Callable[[], None]]:
    import torch
    from mpi4py import MPI

    from ringtorch._observe.operation import issued
    from ringtorch.collectives.reduce_op import ReduceOp

    n = nbytes // 4
    size = comm.Get_size()
    tensor = torch.ones(n, dtype=torch.float32)
    out_t = torch.empty(n * size, dtype=torch.float32)
    raw_buf, out_raw = tensor.numpy(), out_t.numpy()  # the same memory: only the layers differ
    seqs = {name: iter(range(1, 1 << 40)) for name in backends}

    def nxt(name: str, what: str) -> Any:  # the operation of one direct call
        return issued(what, next(seqs[name]), far)

    far = time.monotonic() + 3600
    if op == "all_reduce":
        found = {"raw": lambda: comm.Allreduce(MPI.IN_PLACE, raw_buf, MPI.SUM)}
        for name, b in backends.items():
            found[name] = lambda b=b, name=name: b.all_reduce(tensor, ReduceOp.SUM, nxt(name, "all_reduce"))
        if facade is not None:
            found["facade"] = lambda: facade.all_reduce(tensor)
    elif op == "broadcast":
        found = {"raw": lambda: comm.Bcast(raw_buf, 0)}
        for name, b in backends.items():
            found[name] = lambda b=b, name=name: b.broadcast(tensor, 0, nxt(name, "broadcast"))
        if facade is not None:
            found["facade"] = lambda: facade.broadcast(tensor, 0)
    else:
        found = {"raw": lambda: comm.Allgather(raw_buf, out_raw)}
        for name, b in backends.items():
            found[name] = lambda b=b, name=name: b.all_gather(out_t, tensor, nxt(name, "all_gather"))
        if facade is not None:
            gather = getattr(facade, "all_gather_single", None) or facade.all_gather_into_tensor
            found["facade"] = lambda: gather(out_t, tensor)
    return found


def _facade():
    """ringtorch.distributed on the mpi backend, or None when this version cannot make one."""
    try:
        import ringtorch.distributed as dist

        dist.init_process_group("mpi")
        return dist
    except Exception as exc:  # reported, and the rest of the benchmark goes on
        print(f"# facade skipped: init_process_group('mpi') failed: {exc}", file=sys.stderr)
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--ops", default="all_reduce,broadcast,all_gather")
    parser.add_argument("--max-bytes", default="64M")
    parser.add_argument("--seconds", type=float, default=0.4, help="time per size and variant")
    parser.add_argument("--json", help="also write the results here (bench/_report.py's format; "
                        "rank 0 writes it)")
    args = parser.parse_args()
    recorder = Recorder("mpi")
    from ringtorch.collectives.backends import mpi_env

    if not mpi_env.launched_by_mpi():
        return _relaunch(args)

    from ringtorch._config import override
    from ringtorch.collectives.backends.base import BackendContext
    from ringtorch.collectives.backends.mpi import MpiBackend

    rank, size = mpi_env.world_rank_and_size()
    MPI = mpi_env.init_mpi()
    comm = MPI.COMM_WORLD.Dup()
    backends = {}
    for name, check in (("backend", True), ("nocheck", False)):
        with override(MPI_CHECK=check):
            ctx = BackendContext(store=None, rank=rank, size=size, timeout=timedelta(hours=1),
                                 group_name=name, global_ranks=tuple(range(size)))
            backends[name] = MpiBackend(ctx)
    facade = _facade()
    if rank == 0:
        print(f"# MPI backend vs raw mpi4py, world {size}, float32, median µs per call "
              f"({MPI.Get_library_version().splitlines()[0].strip()}, "
              f"{mpi_env.thread_level_name()})")
    limit = _nbytes(args.max_bytes)
    cells = []
    for op in args.ops.split(","):
        names = None
        for label in SIZES:
            nbytes = _nbytes(label)
            if nbytes > limit:
                break
            variants = _variants(op, nbytes, comm, backends, facade)
            if names is None:
                names = list(variants)
                if rank == 0:
                    print(f"\n## {op}\n\n| bytes | " + " | ".join(f"{v} µs" for v in names)
                          + " | " + " | ".join(f"{v}/raw" for v in names[1:]) + " |")
                    print("|---" * (2 * len(names)) + "|")
            for fn in variants.values():  # warm-up
                fn()
            probe = _timed(variants["raw"], comm.Barrier)
            reps = int(comm.bcast(max(5, min(1000, args.seconds / max(probe, 1e-6))), 0))
            times: dict[str, list[float]] = {v: [] for v in variants}
            for _ in range(reps):
                for v, fn in variants.items():
                    times[v].append(_timed(fn, comm.Barrier))
            if rank == 0:
                med = {v: statistics.median(t) * 1e6 for v, t in times.items()}
                print(f"| {label} | " + " | ".join(f"{med[v]:.1f}" for v in names) + " | "
                      + " | ".join(f"{med[v] / med['raw']:.2f}" for v in names[1:]) + " |",
                      flush=True)
                cells += [{"op": op, "bytes": nbytes, "variant": v, "us": med[v]} for v in names]
    for b in backends.values():
        b.close()
    if facade is not None:
        facade.destroy_process_group()
    comm.Free()
    if rank == 0:
        # results: {"world", "library", "cells": [{"op", "bytes", "variant" (raw, backend,
        # nocheck, facade), "us" (median per call)}]}
        recorder.write(args.json, {"world": size, "cells": cells,
                                   "library": MPI.Get_library_version().splitlines()[0].strip()})
    return 0


if __name__ == "__main__":
    sys.exit(main())

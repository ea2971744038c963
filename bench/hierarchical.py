"""Hierarchical collectives (shared memory within each host, TCP between hosts) against the
socket path, on fake hosts (RINGTORCH_HOST_ID per rank; TCP between them over loopback).

    python bench/hierarchical.py                      # 2 hosts x 2 ranks, all_reduce 1K..16M
    python bench/hierarchical.py --hosts aaab --sizes 1K,1M --repeat 5
    python bench/hierarchical.py --ops broadcast,all_gather,reduce_scatter,barrier
    python bench/hierarchical.py --ops all_gather,reduce_scatter --sizes 64K..16M --forced
    python bench/hierarchical.py --sliced          # all_reduce through leaders vs sliced
    python bench/hierarchical.py --json bench/out/hier.json   # also bench/_report.py's JSON

Modes, each in its own world of processes, interleaved, --repeat times: ``hier`` is
NativeBackend with RINGTORCH_SHM=1 (shared memory within each fake host, the hosts'
leaders over TCP), ``sockets`` the same backend with RINGTORCH_SHM=0 (Unix sockets within a
host, TCP across), ``one-host`` (--one-host) every rank on one host with shared memory, for
reference, ``hier-forced`` (--forced) hier with all_gather and reduce_scatter hierarchical
at every size (by default they take the socket path from 256 KiB), and ``hier-sliced``
(--sliced) hier with all_reduce sliced at every size (every rank talks across; see
transports/hierarchy.py). Every timed call follows a barrier; an iteration's time is the slowest
rank's; a run's time is the median over iterations, and the table shows the median over
repeats. float32 SUM; sizes are nccl-tests' (the whole buffer: all_gather's output,
reduce_scatter's input) and so are the bus-bandwidth factors; the first call of every case
is checked for the right result. Ranks are not pinned. The machine's load average is printed
with the table: trust ratios within one run, not absolute numbers, on a shared machine.
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


def iterations(nbytes: int, most: int = 500) -> tuple[int, int]:
    """(warm-up, timed) iterations: many for small sizes (at most ``most``), at least 5."""
    iters = max(5, min(most, int(1e8 / max(nbytes, 1))))
    return max(2, iters // 10), iters


def rank_main(rank: int, world_size: int, hosts: str, shm: bool, ops: list[str],
              sizes: list[int], tweaks: dict[str, int], most: int = 500) -> Any:
    """One rank: build the backend on its fake host, time every op at every size
    (``tweaks``: the hierarchy transport's thresholds to set first)."""
    import torch
    import torch.distributed as tdist

    from ringtorch import _config
    from ringtorch._observe.operation import issued
    from ringtorch.collectives.backends.base import BackendContext
    from ringtorch.collectives.backends.native import NativeBackend
    from ringtorch.collectives.reduce_op import ReduceOp
    from ringtorch.collectives.transports import hierarchy as shm_hierarchy

    for name, value in tweaks.items():
        setattr(shm_hierarchy, name, value)

    torch.set_num_threads(1)
    store = tdist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world_size, rank == 0,
                           timeout=timedelta(seconds=120))
    ctx = BackendContext(store=store, rank=rank, size=world_size,
                         timeout=timedelta(seconds=120), group_name="bench",
                         global_ranks=tuple(range(world_size)))
    with _config.override(SHM=shm, HOST_ID=f"host-{hosts[rank]}", SOCKET_ADDR="127.0.0.1"):
        b = NativeBackend(ctx)
    seq = 0
    ws, total = world_size, world_size * (world_size + 1) / 2

    def call(op: str, nbytes: int) -> Any:
        """Run ``op`` once on fresh buffers (sizes as nccl-tests: the whole buffer); return
        what must equal ``want``."""
        nonlocal seq
        seq += 1
        d = time.monotonic() + 120
        n = nbytes // 4
        if op == "all_reduce":
            t = torch.full((n,), float(rank + 1))
            b.all_reduce(t, ReduceOp.SUM, issued("all_reduce", seq, d))
            return t, total
        if op == "broadcast":
            t = torch.full((n,), float(rank + 1))
            b.broadcast(t, ws - 1, issued("broadcast", seq, d))
            return t, float(ws)
        if op == "all_gather":
            out = torch.empty(n // ws * ws)
            b.all_gather(out, torch.full((n // ws,), 1.0), issued("all_gather", seq, d))
            return out, 1.0
        if op == "reduce_scatter":
            out = torch.empty(n // ws)
            b.reduce_scatter(out, torch.full((n // ws * ws,), float(rank + 1)), ReduceOp.SUM,
                             issued("reduce_scatter", seq, d))
            return out, total
        b.barrier(issued("barrier", seq, d))
        return torch.ones(1), 1.0

    times: dict[str, list[float]] = {}
    for op in ops:
        for nbytes in sizes if op != "barrier" else sizes[:1]:
            got, want = call(op, nbytes)
            if not bool((got == want).all()):
                raise RuntimeError(f"wrong {op} result at {human(nbytes)}")
            warm, iters = iterations(nbytes, most)
            spent = []
            for i in range(warm + iters):
                seq += 1
                b.barrier(issued("barrier", seq, time.monotonic() + 120))
                start = time.perf_counter()
                call(op, nbytes)
                if i >= warm:
                    spent.append(time.perf_counter() - start)
            times[f"{op}/{nbytes}"] = spent
    topology = b.topology
    b.close()
    return {"times": times, "topology": topology}


def run_mode(hosts: str, shm: bool, ops: list[str], sizes: list[int],
             tweaks: dict[str, int], most: int = 500) -> tuple[dict[str, float], str]:
    """Median over iterations of the slowest rank's time, per op and size."""
    from ringtorch.testing import run_ranks

    results = run_ranks(rank_main, len(hosts), args=(hosts, shm, ops, sizes, tweaks, most),
                        timeout=600)
    medians = {}
    for key in results[0]["times"]:
        per_iter = [max(res["times"][key][i] for res in results)
                    for i in range(len(results[0]["times"][key]))]
        medians[key] = statistics.median(per_iter)
    return medians, results[0]["topology"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", default="aabb",
                        help="a host letter per rank (default aabb: 2 hosts x 2 ranks)")
    parser.add_argument("--ops", default="all_reduce",
                        help="comma-separated: all_reduce, broadcast, all_gather, "
                             "reduce_scatter, barrier")
    parser.add_argument("--sizes", default="1K..16M", help="e.g. 1K..16M or 1K,1M")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one-host", action="store_true",
                        help="also run every rank on one host (flat shared memory)")
    parser.add_argument("--forced", action="store_true",
                        help="also run all_gather and reduce_scatter hierarchical at every "
                             "size (hier-forced; they take the socket path from 256 KiB)")
    parser.add_argument("--sliced", action="store_true",
                        help="also run all_reduce sliced at every size (hier-sliced: every "
                             "rank talks across; needs as many ranks on every host)")
    parser.add_argument("--max-iters", type=int, default=500,
                        help="timed iterations per size at most (small sizes run this many)")
    parser.add_argument("--json", help="also write the results here (bench/_report.py's format)")
    args = parser.parse_args()
    recorder = Recorder("hierarchy")
    ops, sizes = args.ops.split(","), parse_sizes(args.sizes)
    ws = len(args.hosts)
    modes: dict[str, tuple[str, bool, dict[str, int]]] = {
        "hier": (args.hosts, True, {}), "sockets": (args.hosts, False, {})}
    if args.one_host:
        modes["one-host"] = ("a" * ws, True, {})
    if args.forced:
        modes["hier-forced"] = (args.hosts, True, {"SOCKETS_FROM_NBYTES": 1 << 62})
    if args.sliced:
        modes["hier-sliced"] = (args.hosts, True, {"SLICED_FROM_NBYTES": 1})
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    topologies = {}
    for _ in range(args.repeat):
        for mode, (hosts, shm, tweaks) in modes.items():
            medians, topologies[mode] = run_mode(hosts, shm, ops, sizes, tweaks, args.max_iters)
            runs[mode].append(medians)
    load = os.getloadavg()
    print(f"world {ws}, hosts {args.hosts}, float32 (SUM), median of {args.repeat} runs; "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    for mode, topo in topologies.items():
        print(f"  {mode}: {topo}")
    print()
    heads = [f"{m} µs" for m in modes] + ["hier busbw GB/s", "sockets/hier"]
    print("| op | size | " + " | ".join(heads) + " |")
    print("|---" * (len(heads) + 2) + "|")
    found: list[dict[str, Any]] = []
    for key in runs["hier"][0]:
        op, nbytes = key.split("/")[0], int(key.split("/")[1])
        us = {m: statistics.median(r[key] for r in runs[m]) * 1e6 for m in modes}
        busbw = nbytes * busbw_factor(op, ws) / (us["hier"] * 1e-6) / 1e9
        cells = [f"{us[m]:,.1f}" if us[m] < 100 else f"{us[m]:,.0f}" for m in modes]
        cells += ["" if op == "barrier" else f"{busbw:.2f}", f"{us['sockets'] / us['hier']:.2f}x"]
        size = "-" if op == "barrier" else human(nbytes)
        print(f"| {op} | {size} | " + " | ".join(cells) + " |")
        found += [{"op": op, "bytes": None if op == "barrier" else nbytes, "mode": m,
                   "seconds": us[m] * 1e-6} for m in modes]
    sys.stdout.flush()
    # results: {"hosts", "world", "repeat", "modes", "topologies": {mode: text},
    # "cells": [{"op", "bytes" (None for barrier), "mode", "seconds"}]}
    recorder.write(args.json, {"hosts": args.hosts, "world": ws, "repeat": args.repeat,
                               "modes": list(modes), "cells": found,
                               "topologies": {m: str(t) for m, t in topologies.items()}})


if __name__ == "__main__":
    main()

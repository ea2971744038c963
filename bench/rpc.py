"""rpc_sync round trips: ringtorch vs torch.distributed.rpc (TensorPipe), side by side.

Each round starts two fresh worker processes per system (torch's TensorPipe agent keeps
threads busy that would slow down anything else running in its processes, so the two systems
never share a process). Worker 0 calls ``echo`` on worker 1 with a tiny argument (an int), a
4 MB and a 64 MB float32 tensor; the tensor goes there and back. Rounds alternate the order of
the two systems so that the machine's noise hits both alike. The table shows, per size and
system, the median and p90 round trip over all rounds, the throughput (bytes moved both ways
/ median), and the ratio torch / ringtorch of the medians (above 1: ringtorch is faster). The
first reply of each size is checked against the argument.

    .venv/bin/python bench/rpc.py
    .venv/bin/python bench/rpc.py --rounds 5 --json rpc.json
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys

from _report import Recorder  # bench/ is sys.path[0]

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = {"tiny": None, "4MB": 4 << 20, "64MB": 64 << 20}
ITERS = {"tiny": 2000, "4MB": 60, "64MB": 6}


def echo(x):
    return x


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _init(system: str, rank: int, port: int):
    if system == "torch":
        import torch.distributed.rpc as rpc
    else:
        import ringtorch.distributed.rpc as rpc
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}",
                                              rpc_timeout=120)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    return rpc


def _measure(rpc, arg, iters: int) -> list[float]:
    import time

    for _ in range(3):
        rpc.rpc_sync("worker1", echo, args=(arg,))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        rpc.rpc_sync("worker1", echo, args=(arg,))
        times.append(time.perf_counter() - start)
    return times


def _check(rpc, arg) -> None:
    import torch

    out = rpc.rpc_sync("worker1", echo, args=(arg,))
    same = torch.equal(out, arg) if isinstance(arg, torch.Tensor) else out == arg
    if not same:
        raise AssertionError("echo returned something else than its argument")


def _worker(rank: int, system: str, port: int, sizes: list[str], out) -> None:
    import torch

    rpc = _init(system, rank, port)
    if rank == 0:
        args = {s: 1 if SIZES[s] is None else torch.rand(SIZES[s] // 4) for s in sizes}
        results = {}
        for size in sizes:
            _check(rpc, args[size])
            results[size] = _measure(rpc, args[size], ITERS[size])
        out.send(results)
    rpc.shutdown()


def _round(system: str, sizes: list[str]) -> dict[str, list[float]]:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, system, port, sizes, child))
             for r in range(2)]
    for proc in procs:
        proc.start()
    results = parent.recv()
    for proc in procs:
        proc.join(120)
    return results


def _table(results: dict[str, dict[str, list[float]]]) -> list[dict[str, object]]:
    rows = []
    for size, by_system in results.items():
        medians = {}
        for name, times in by_system.items():
            times = sorted(times)
            median = statistics.median(times)
            medians[name] = median
            moved = 2 * (SIZES[size] or 0)
            rows.append({"size": size, "system": name, "median_us": median * 1e6,
                         "p90_us": times[int(0.9 * (len(times) - 1))] * 1e6,
                         "GB/s": moved / median / 1e9 if moved else None, "n": len(times)})
        rows[-1]["torch/ringtorch"] = medians["torch"] / medians["ringtorch"]
        rows[-2]["torch/ringtorch"] = rows[-1]["torch/ringtorch"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated, of "
                        + ", ".join(SIZES))
    parser.add_argument("--json", help="also write the results here (bench/_report.py's format)")
    ns = parser.parse_args()
    recorder = Recorder("rpc")
    sizes = ns.sizes.split(",")
    systems = ["ringtorch", "torch"]
    results: dict[str, dict[str, list[float]]] = {s: {n: [] for n in systems} for s in sizes}
    for round_ in range(ns.rounds):
        for system in systems if round_ % 2 == 0 else reversed(systems):
            for size, times in _round(system, sizes).items():
                results[size][system] += times
    rows = _table(results)
    print(f"{'size':>6} {'system':>10} {'median µs':>11} {'p90 µs':>10} {'GB/s':>6} "
          f"{'torch/ringtorch':>16}")
    for row in rows:
        gbps = f"{row['GB/s']:.2f}" if row["GB/s"] else "-"
        ratio = f"{row['torch/ringtorch']:.2f}x" if row["system"] == "ringtorch" else ""
        print(f"{row['size']:>6} {row['system']:>10} {row['median_us']:>11.1f} "
              f"{row['p90_us']:>10.1f} {gbps:>6} {ratio:>16}")
    # results: {"rounds", "rows": [{"size", "system", "median_us", "p90_us", "GB/s", "n",
    # "torch/ringtorch"}]}
    recorder.write(ns.json, {"rounds": ns.rounds, "rows": rows})


if __name__ == "__main__":
    main()

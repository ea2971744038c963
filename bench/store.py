"""TCPStore throughput: ringtorch vs torch, side by side in one run.

For each store, the master lives in this process (its server thread serves, it issues no
operations) and ``--clients`` client processes hammer it with one operation at a time:
``set`` (a key per client, a small value), ``get`` (an existing key) and ``add`` (one key
shared by every client). ``set`` is not answered (in torch either), so each client ends its
``set`` run with one round trip: the time counts until the server has applied every set.
Each client runs ``--seconds`` per operation after a common start signal; the table shows
total operations per second over all clients, and the ratio ringtorch / torch.

    .venv/bin/python bench/store.py                 # 4 clients, 2 s per operation
    .venv/bin/python bench/store.py --clients 8 --seconds 3 --rounds 3
    .venv/bin/python bench/store.py --json bench/out/store.json   # also bench/_report.py's JSON
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from datetime import timedelta

from _report import Recorder  # bench/ is sys.path[0]

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OPS = ("set", "get", "add")


def _make_store(kind: str, port: int, is_master: bool):
    if kind == "torch":
        import torch.distributed as dist

        return dist.TCPStore("127.0.0.1", port, None, is_master, timedelta(seconds=60),
                             wait_for_workers=False)
    from ringtorch.store import TCPStore

    return TCPStore("127.0.0.1", port, None, is_master, timedelta(seconds=60),
                    wait_for_workers=False)


def _client(kind: str, port: int, index: int, seconds: float, round_: int, out) -> None:
    store = _make_store(kind, port, False)
    value = b"v" * 16
    key = f"key{index}"
    store.set(key, value)
    results = {}
    for op in OPS:
        store.add(f"ready/{round_}/{op}", 1)
        store.wait([f"go/{round_}/{op}"])
        if op == "set":
            fn = lambda: store.set(key, value)
        elif op == "get":
            fn = lambda: store.get(key)
        else:
            fn = lambda: store.add("counter", 1)
        count = 0
        cpu_start = time.process_time()
        start = time.perf_counter()
        end = start + seconds
        while True:
            for _ in range(50):
                fn()
            count += 50
            if time.perf_counter() >= end:
                break
        # set is not answered (in torch either): a round trip makes sure the server has
        # applied every set before the clock stops, so no backlog spills into the next op.
        store.check([key])
        results[op] = (count, time.perf_counter() - start, time.process_time() - cpu_start)
        store.add(f"done/{round_}/{op}", 1)
    out.send(results)


def _wait_count(master, key: str, count: int) -> None:
    while int(master.add(key, 0)) < count:
        time.sleep(0.005)


def _run(kind: str, clients: int, seconds: float, round_: int
         ) -> tuple[dict[str, float], dict[str, float]]:
    """ops/s, and (server, client) CPU seconds per op; the server is this process's only
    busy part."""
    master = _make_store(kind, 0, True)
    ctx = mp.get_context("spawn")
    pipes, procs = [], []
    for index in range(clients):
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_client, args=(kind, master.port, index, seconds, round_,
                                                 child))
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    cpu = {}
    for op in OPS:
        _wait_count(master, f"ready/{round_}/{op}", clients)
        cpu_before = time.process_time()
        master.set(f"go/{round_}/{op}", b"1")
        _wait_count(master, f"done/{round_}/{op}", clients)
        cpu[op] = time.process_time() - cpu_before
    results = [p.recv() for p in pipes]
    for proc in procs:
        proc.join()
    if kind == "torch":
        del master
    else:
        master.close()
    rates = {op: sum(r[op][0] for r in results) / max(r[op][1] for r in results) for op in OPS}
    ops = {op: sum(r[op][0] for r in results) for op in OPS}
    return rates, {op: (cpu[op] / ops[op], sum(r[op][2] for r in results) / ops[op])
                   for op in OPS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="alternate torch and ringtorch this many times; report medians")
    parser.add_argument("--json", help="also write the results here (bench/_report.py's format)")
    args = parser.parse_args()
    recorder = Recorder("store")
    samples: dict[str, dict[str, list[float]]] = {k: {op: [] for op in OPS}
                                                  for k in ("torch", "ringtorch")}
    cpu: dict[str, dict[str, list[tuple[float, float]]]] = {
        k: {op: [] for op in OPS} for k in ("torch", "ringtorch")}
    for round_ in range(args.rounds):
        for kind in ("torch", "ringtorch"):
            rates, cpu_per_op = _run(kind, args.clients, args.seconds, round_)
            for op in OPS:
                samples[kind][op].append(rates[op])
                cpu[kind][op].append(cpu_per_op[op])
    print(f"TCPStore throughput, {args.clients} client processes, {args.seconds:g} s per op, "
          f"{args.rounds} round(s), median ops/s ({os.cpu_count()} CPUs)")
    print("| op | torch ops/s | ringtorch ops/s | ringtorch / torch | CPU us/op torch "
          "(server + client) | CPU us/op ringtorch (server + client) |")
    print("|---|---|---|---|---|---|")
    rows = []
    for op in OPS:
        t = statistics.median(samples["torch"][op])
        r = statistics.median(samples["ringtorch"][op])
        tc = [statistics.median(c[i] for c in cpu["torch"][op]) * 1e6 for i in (0, 1)]
        rc = [statistics.median(c[i] for c in cpu["ringtorch"][op]) * 1e6 for i in (0, 1)]
        print(f"| {op} | {t:,.0f} | {r:,.0f} | {r / t:.2f}x | {tc[0]:.1f} + {tc[1]:.1f} "
              f"| {rc[0]:.1f} + {rc[1]:.1f} |")
        rows.append({"op": op, "torch_ops_s": t, "ringtorch_ops_s": r,
                     "torch_cpu_us": tc, "ringtorch_cpu_us": rc})
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    # results: {"clients", "seconds", "rounds", "rows": [{"op", "torch_ops_s",
    # "ringtorch_ops_s", "torch_cpu_us": [server, client], "ringtorch_cpu_us": [...]}]}
    recorder.write(args.json, {"clients": args.clients, "seconds": args.seconds,
                               "rounds": args.rounds, "rows": rows})


if __name__ == "__main__":
    main()

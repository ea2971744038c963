"""TCPStore throughput: ringtorch vs torch, side by side in one run, at several client counts.

For each store, the master lives in this process (its server thread serves, it issues no
operations) and ``--procs`` driver processes run the clients: each process holds
clients / procs client connections, one thread per connection, and every thread issues one
operation at a time. The same driver runs both stores (torch's client releases the GIL while
it waits on its socket, ringtorch's in every socket call). The operations:

    set        a key per client, 16-byte value (unanswered in both stores: each client ends its
               run with one round trip, so the time counts until the server applied every set)
    get        the client's own key (present)
    add        one key shared by every client
    wait       the client's own key (present: answered at once)
    multi_get  4 present keys

Each client runs ``--seconds`` per operation after a common start signal; the table shows
total operations per second over all clients, the ratio ringtorch / torch, and the CPU per
operation of the server (this process) and of the clients (the driver processes).

    .venv/bin/python bench/store.py                       # 4, 32 and 256 clients, 2 s per op
    .venv/bin/python bench/store.py --clients 4 --seconds 3 --rounds 3
    .venv/bin/python bench/store.py --json bench/out/store.json   # also bench/_report.py's JSON
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from datetime import timedelta

from _report import Recorder  # bench/ is sys.path[0]

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

OPS = ("set", "get", "add", "wait", "multi_get")
VALUE = b"v" * 16
MULTI_KEYS = 4


def _make_store(kind: str, port: int, is_master: bool):
    if kind == "torch":
        import torch.distributed as dist

        return dist.TCPStore("127.0.0.1", port, None, is_master, timedelta(seconds=120),
                             wait_for_workers=False)
    from ringtorch.store import TCPStore

    return TCPStore("127.0.0.1", port, None, is_master, timedelta(seconds=120),
                    wait_for_workers=False)


def _hammer(store, op: str, index: int, clients: int, go: threading.Event, end: list[float],
            counts: list[int]) -> None:
    key = f"key{index}"
    keys = [f"key{(index + j) % clients}" for j in range(MULTI_KEYS)]
    if op == "set":
        fn = lambda: store.set(key, VALUE)
    elif op == "get":
        fn = lambda: store.get(key)
    elif op == "add":
        fn = lambda: store.add("counter", 1)
    elif op == "wait":
        fn = lambda: store.wait([key])
    else:
        fn = lambda: store.multi_get(keys)
    go.wait()
    count = 0
    while True:
        for _ in range(20):
            fn()
        count += 20
        if time.perf_counter() >= end[0]:
            break
    # set is not answered (in torch either): a round trip makes sure the server has applied
    # every set before the clock stops, so no backlog spills into the next op.
    store.check([key])
    counts[index] = count


def _driver(kind: str, port: int, first: int, count: int, clients: int, seconds: float,
            round_: int, out) -> None:
    stores = [_make_store(kind, port, False) for _ in range(count)]
    ctl = stores[0]
    for i, store in enumerate(stores):
        store.set(f"key{first + i}", VALUE)
    results = {}
    for op in OPS:
        counts = [0] * (first + count)
        go, end = threading.Event(), [0.0]
        threads = [threading.Thread(target=_hammer, args=(store, op, first + i, clients, go,
                                                          end, counts))
                   for i, store in enumerate(stores)]
        for thread in threads:
            thread.start()
        ctl.add(f"ready/{round_}/{op}", 1)
        ctl.wait([f"go/{round_}/{op}"])
        cpu_start = time.process_time()
        start = time.perf_counter()
        end[0] = start + seconds
        go.set()
        for thread in threads:
            thread.join()
        results[op] = (sum(counts), time.perf_counter() - start, time.process_time() - cpu_start)
        ctl.add(f"done/{round_}/{op}", 1)
    out.send(results)
    out.close()


def _wait_count(master, key: str, count: int) -> None:
    while int(master.add(key, 0)) < count:
        time.sleep(0.005)


def _run(kind: str, clients: int, procs: int, seconds: float, round_: int
         ) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """ops/s, and (server, client) CPU seconds per op; the server is this process's only
    busy part."""
    master = _make_store(kind, 0, True)
    ctx = mp.get_context("spawn")
    pipes, children = [], []
    share = [clients // procs + (1 if p < clients % procs else 0) for p in range(procs)]
    first = 0
    for count in share:
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_driver, args=(kind, master.port, first, count, clients,
                                                 seconds, round_, child))
        proc.start()
        first += count
        pipes.append(parent)
        children.append(proc)
    cpu = {}
    for op in OPS:
        _wait_count(master, f"ready/{round_}/{op}", procs)
        cpu_before = time.process_time()
        master.set(f"go/{round_}/{op}", b"1")
        _wait_count(master, f"done/{round_}/{op}", procs)
        cpu[op] = time.process_time() - cpu_before
    results = [p.recv() for p in pipes]
    for proc in children:
        proc.join()
    if kind == "torch":
        del master
    else:
        master.close()
    ops = {op: sum(r[op][0] for r in results) for op in OPS}
    rates = {op: ops[op] / max(r[op][1] for r in results) for op in OPS}
    return rates, {op: (cpu[op] / ops[op], sum(r[op][2] for r in results) / ops[op])
                   for op in OPS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="4,32,256",
                        help="comma-separated client counts (connections), e.g. 4,32,256")
    parser.add_argument("--procs", type=int, default=4,
                        help="driver processes sharing the clients (at most one per client)")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="alternate torch and ringtorch this many times; report medians")
    parser.add_argument("--json", help="also write the results here (bench/_report.py's format)")
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    recorder = Recorder("store")
    rows = []
    print(f"TCPStore throughput, {args.procs} driver processes, {args.seconds:g} s per op, "
          f"{args.rounds} round(s), median ops/s ({os.cpu_count()} CPUs)")
    print("| clients | op | torch ops/s | ringtorch ops/s | ringtorch / torch | CPU us/op torch "
          "(server + client) | CPU us/op ringtorch (server + client) |")
    print("|---|---|---|---|---|---|---|")
    for clients in counts:
        procs = min(args.procs, clients)
        samples: dict[str, dict[str, list[float]]] = {k: {op: [] for op in OPS}
                                                      for k in ("torch", "ringtorch")}
        cpu: dict[str, dict[str, list[tuple[float, float]]]] = {
            k: {op: [] for op in OPS} for k in ("torch", "ringtorch")}
        for round_ in range(args.rounds):
            for kind in ("torch", "ringtorch"):
                rates, cpu_per_op = _run(kind, clients, procs, args.seconds, round_)
                for op in OPS:
                    samples[kind][op].append(rates[op])
                    cpu[kind][op].append(cpu_per_op[op])
        for op in OPS:
            t = statistics.median(samples["torch"][op])
            r = statistics.median(samples["ringtorch"][op])
            tc = [statistics.median(c[i] for c in cpu["torch"][op]) * 1e6 for i in (0, 1)]
            rc = [statistics.median(c[i] for c in cpu["ringtorch"][op]) * 1e6 for i in (0, 1)]
            print(f"| {clients} | {op} | {t:,.0f} | {r:,.0f} | {r / t:.2f}x | {tc[0]:.1f} + "
                  f"{tc[1]:.1f} | {rc[0]:.1f} + {rc[1]:.1f} |", flush=True)
            rows.append({"clients": clients, "procs": procs, "op": op, "torch_ops_s": t,
                         "ringtorch_ops_s": r, "torch_cpu_us": tc, "ringtorch_cpu_us": rc})
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    # results: {"clients": [4, 32, 256], "procs", "seconds", "rounds", "rows": [{"clients",
    # "procs", "op", "torch_ops_s", "ringtorch_ops_s", "torch_cpu_us": [server, client],
    # "ringtorch_cpu_us": [...]}]}
    recorder.write(args.json, {"clients": counts, "procs": args.procs, "seconds": args.seconds,
                               "rounds": args.rounds, "rows": rows})


if __name__ == "__main__":
    main()

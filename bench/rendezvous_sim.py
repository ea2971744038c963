"""A rendezvous of thousands of ranks on one machine: the store traffic of a job's start.

Each simulated rank replays, against one store server, the requests a ringtorch rank sends
for ``init_process_group`` + ``new_group`` over every rank (the barriers after each go over the
collective transport, not the store), in the order and with the keys and value sizes logged
from a real world-4 run on one host:

    join (the client's constructor), add rt_init_generation/<r>,
    per group (default_pg/0// then default_pg/0//1//):
      set rt_proc/<r>, set rt_mesh/host/<r>, wait + multi_get the N host records,
      set rt_mesh/addr/<r>, wait + multi_get the addresses of the ranks above r,
      set rt_shm/seg/<r>, wait + multi_get the N segment records,
      set rt_shm/mapped/<r>, wait + multi_get the N verdicts,
    after the default group's: add ringtorch/hang/installs/<r>, set ringtorch/hang/info/<r>,
      and a second connection (the hang-report listener, ``clone()``) parked in a wait.

The same calls go to ringtorch's store (its real server in a process of its own, and its own
client, which imports no torch: handshake with a job secret, the real wire protocol) and to
torch's TCPStore (its libuv server in a process of its own, its Python client). Ranks are
threads, --procs driver processes share them; every rank starts at one signal. Reported per
store and world: the time until the last rank is through, the median rank's time, the server
process's CPU time and memory (RSS at the end, and its peak), and the requests per rank.

    .venv/bin/python bench/rendezvous_sim.py                     # 1,024 and 4,096 ranks
    .venv/bin/python bench/rendezvous_sim.py --ranks 64 --json bench/out/rendezvous.json
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import sys
import threading
import time
from datetime import timedelta

from _report import Recorder  # bench/ is sys.path[0]

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STORES = ("torch", "ringtorch")
GROUPS = ("default_pg/0//", "default_pg/0//1//")
# Value sizes of the logged run: a process record, a host identity, a mesh address, a shared-
# memory segment record, a hang-report record.
PROC, HOST = b"p" * 65, b"h" * 39
ADDR, SEG, INFO = b"a" * 90, b"s" * 227, b"i" * 172
TIMEOUT = timedelta(seconds=900)


def _raise_fd_limit() -> int:
    """The soft descriptor limit raised to the hard one; the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _store_class(kind: str):
    if kind == "torch":
        import torch.distributed as dist

        return dist.TCPStore
    from ringtorch.store import TCPStore

    return TCPStore


def _client(kind: str, port: int):
    return _store_class(kind)("127.0.0.1", port, None, False, TIMEOUT)


def _serve(kind: str, pipe) -> None:
    """A store's server in a process of its own: the master store, until told to stop."""
    _raise_fd_limit()
    master = _store_class(kind)("127.0.0.1", 0, None, True, TIMEOUT, wait_for_workers=False)
    pipe.send(master.port)
    pipe.recv()  # stop
    if kind == "ringtorch":
        master.close()
    os._exit(0)


def _group(store, pg: str, r: int, world: int) -> int:
    """One group's setup as a rank sends it (mesh, then shared memory); its API calls."""
    def read(keys: list[str]) -> None:
        store.wait(keys)
        store.multi_get(keys)

    calls = 0
    store.set(f"{pg}rt_proc/{r}", PROC)
    store.set(f"{pg}rt_mesh/host/{r}", HOST)
    read([f"{pg}rt_mesh/host/{i}" for i in range(world)])
    store.set(f"{pg}rt_mesh/addr/{r}", ADDR)
    calls += 5
    if r + 1 < world:
        read([f"{pg}rt_mesh/addr/{i}" for i in range(r + 1, world)])
        calls += 2
    store.set(f"{pg}rt_shm/seg/{r}", SEG)
    read([f"{pg}rt_shm/seg/{i}" for i in range(world)])
    store.set(f"{pg}rt_shm/mapped/{r}", b"ok")
    read([f"{pg}rt_shm/mapped/{i}" for i in range(world)])
    return calls + 6


def _rank(kind: str, port: int, r: int, world: int, dial: threading.Event,
          go: threading.Event, connected: list[int], out: dict[int, tuple]) -> None:
    dial.wait()
    store = _client(kind, port)  # connects, proves the secret, joins (one add)
    # The hang-report listener: a connection of its own, parked in a wait. torch's clone()
    # and constructor look the peer's name up, which stalls 1-5 s where no DNS answers (this
    # sandbox): every connection is made before the clock starts, and timed apart.
    listener = store.clone()
    connected.append(r)
    go.wait()
    calls = 1  # the join
    store.add(f"rt_init_generation/{r}", 1)
    calls += 1 + _group(store, GROUPS[0], r, world)
    store.add(f"ringtorch/hang/installs/{r}", 1)
    store.set(f"ringtorch/hang/info/{r}", INFO)
    calls += 2
    waiter = threading.Thread(target=listener.wait, args=([f"ringtorch/hang/ask/1/{r}/1"],
                                                          TIMEOUT))
    waiter.start()
    init_calls = calls
    calls += _group(store, GROUPS[1], r, world)
    through = time.monotonic()
    wire = None
    if kind == "ringtorch":  # what the client sent, as the store counts it
        wire = store.statistics().requests
    out[r] = (through, init_calls, calls - init_calls, wire, store, listener, waiter)


def _driver(kind: str, port: int, world: int, ranks: list[int], ready, dial_event, go_event,
            pipe) -> None:
    _raise_fd_limit()
    _store_class(kind)  # imported before the start signal: the clock is for the traffic
    threading.stack_size(512 * 1024)
    dial, go = threading.Event(), threading.Event()
    connected: list[int] = []
    out: dict[int, tuple] = {}
    threads = [threading.Thread(target=_rank, args=(kind, port, r, world, dial, go, connected,
                                                    out))
               for r in ranks]
    for thread in threads:
        thread.start()
    ready.put(len(threads))
    dial_event.wait()
    dial.set()
    while len(connected) < len(ranks):
        time.sleep(0.002)
    ready.put(time.monotonic())
    go_event.wait()
    go.set()
    for thread in threads:
        thread.join()
    pipe.send({r: v[:4] for r, v in out.items()})
    pipe.recv()  # the listeners have been released
    for v in out.values():
        v[6].join()
    pipe.send("done")
    os._exit(0)  # every client's connection goes with the process


def _proc_stats(pid: int) -> tuple[float, float, float]:
    """CPU seconds (user + system), RSS and peak RSS (MiB) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = peak = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return cpu, rss, peak


def run(kind: str, world: int, procs: int) -> dict:
    """One rendezvous of ``world`` ranks against a fresh server of ``kind``."""
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    server = ctx.Process(target=_serve, args=(kind, there))
    server.start()
    port = here.recv()
    ready, dial_event, go_event = ctx.Queue(), ctx.Event(), ctx.Event()
    drivers, pipes = [], []
    for p in range(procs):
        parent, child = ctx.Pipe()
        ranks = list(range(p, world, procs))
        proc = ctx.Process(target=_driver, args=(kind, port, world, ranks, ready, dial_event,
                                                 go_event, child))
        proc.start()
        drivers.append(proc)
        pipes.append(parent)
    started = sum(ready.get(timeout=600) for _ in range(procs))
    assert started == world
    t_dial = time.monotonic()
    dial_event.set()
    connect_s = max(ready.get(timeout=600) for _ in range(procs)) - t_dial
    cpu_before, _, _ = _proc_stats(server.pid)
    t0 = time.monotonic()
    go_event.set()
    results: dict[int, tuple] = {}
    for pipe in pipes:
        results.update(pipe.recv())
    last = max(v[0] for v in results.values()) - t0
    cpu_after, rss, peak = _proc_stats(server.pid)
    # release the parked listeners with one request, then let everything go
    releaser = _client(kind, port)
    releaser.multi_set([f"ringtorch/hang/ask/1/{r}/1" for r in range(world)],
                       [b"{}"] * world)
    for pipe in pipes:
        pipe.send("release")
    for pipe in pipes:
        pipe.recv()
    for proc in drivers:
        proc.join()
    del releaser
    here.send("stop")
    server.join()
    times = sorted(v[0] - t0 for v in results.values())
    init_calls = max(v[1] for v in results.values())
    group_calls = max(v[2] for v in results.values())
    wires = [v[3] for v in results.values() if v[3] is not None]
    return {"store": kind, "ranks": world, "procs": procs, "connect_s": connect_s, "last_s": last,
            "median_s": statistics.median(times), "server_cpu_s": cpu_after - cpu_before,
            "server_rss_mib": rss, "server_peak_rss_mib": peak,
            "calls_per_rank": {"init": init_calls, "new_group": group_calls},
            "wire_requests_per_rank": max(wires) if wires else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1024,4096", help="comma-separated world sizes")
    parser.add_argument("--procs", type=int, default=8, help="driver processes")
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--json", help="also write the results here (bench/_report.py's format)")
    args = parser.parse_args()
    os.environ.setdefault("RINGTORCH_SECRET", os.urandom(16).hex())  # authenticated, as a job
    # torch's client looks up the name of each connection's address; where no DNS server
    # answers (this sandbox) each lookup waits out the resolver's timeout (5 s by default):
    # capped at 1 s here, and connecting is timed apart from the traffic anyway.
    os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
    # ringtorch gives up on a peer that leaves sent data unacknowledged (or its receive window
    # shut) for 10 s, and its server on a client silent for 10 s in the middle of a request
    # (slowloris): hundreds of rank threads sharing one driver process's GIL, and the server,
    # on 2 shared cores fall that far behind, which ranks on hosts of their own would not.
    # torch has no such limits: both wait here as long as the traffic takes.
    os.environ.setdefault("RINGTORCH_TCP_USER_TIMEOUT_MS", "900000")
    os.environ.setdefault("RINGTORCH_HANDSHAKE_TIMEOUT", "900")
    limit = _raise_fd_limit()
    recorder = Recorder("rendezvous")
    rows = []
    print(f"Rendezvous simulation, {args.procs} driver processes, descriptor limit {limit} "
          f"({os.cpu_count()} CPUs)")
    print("| ranks | store | last rank through (s) | median rank (s) | server CPU (s) | "
          "server RSS (MiB, peak) | calls per rank: init + new_group | wire requests per rank "
          "| connecting (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for world in (int(w) for w in args.ranks.split(",")):
        for kind in args.stores.split(","):
            row = run(kind, world, min(args.procs, world))
            rows.append(row)
            calls = row["calls_per_rank"]
            print(f"| {world} | {kind} | {row['last_s']:.2f} | {row['median_s']:.2f} | "
                  f"{row['server_cpu_s']:.2f} | {row['server_rss_mib']:.0f} "
                  f"({row['server_peak_rss_mib']:.0f}) | {calls['init']} + {calls['new_group']}"
                  f" | {row['wire_requests_per_rank'] or '—'} | {row['connect_s']:.2f} |",
                  flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    # results: {"procs", "fd_limit", "rows": [{"store", "ranks", "procs", "connect_s", "last_s",
    # "median_s", "server_cpu_s", "server_rss_mib", "server_peak_rss_mib", "calls_per_rank":
    # {"init", "new_group"}, "wire_requests_per_rank"}]}
    recorder.write(args.json, {"procs": args.procs, "fd_limit": limit, "rows": rows})


if __name__ == "__main__":
    main()

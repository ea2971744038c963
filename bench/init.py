"""Job start-up: init_process_group plus the first barrier, ringtorch vs gloo in one run.

Each world runs as ``world`` fresh processes; each imports torch and the library first (not
timed), waits for a common start signal, then times ``init_process_group`` (tcp:// rendezvous
on a fresh port) and one ``barrier()``. A world's time is the slowest rank's; the table shows
the median over ``--rounds`` and the ratio ringtorch / gloo. For ringtorch it also shows the
most store requests one rank sent (``TCPStore.statistics()``), which must not grow with the
world size.

The measured checkout's modules are compiled to bytecode first (``__pycache__``, git-ignored),
as an installed package's are: torch's are, and where PYTHONDONTWRITEBYTECODE is set (this
project's machines) every rank would otherwise compile ringtorch's modules from source inside
``init_process_group`` (the backend is imported there): at world 16 on 2 cores that alone was
6.5 s of rank 0's 9.9 s. ``--cold`` skips it, to measure that case.

    .venv/bin/python bench/init.py                              # worlds 8, 16, 32
    .venv/bin/python bench/init.py --world-sizes 4 8 --rounds 3
    PYTHONPATH=/tmp/base .venv/bin/python bench/init.py         # another ringtorch checkout
    .venv/bin/python bench/init.py --json bench/out/init.json   # also bench/_report.py's JSON
    .venv/bin/python bench/init.py --libs ringtorch --agent-store   # the store in this process

``--agent-store``: the store is served by this (the launching) process and every rank is a
client (TORCHELASTIC_USE_AGENT_STORE=True), as under ``ringrun --on-worker-failure continue``.
"""

from __future__ import annotations

import argparse
import compileall
import multiprocessing as mp
import os
import queue
import socket
import statistics
import sys
import time
from typing import Any

from _report import Recorder  # bench/ is sys.path[0]

# after PYTHONPATH's entries, so that another checkout can be measured with this script
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LIBS = ("ringtorch", "gloo")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank(lib: str, rank: int, world: int, port: int, ready: Any, go: Any, out: Any,
          agent_store: bool) -> None:
    if agent_store:
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    if lib == "gloo":
        import torch.distributed as dist
    else:
        import ringtorch.distributed as dist
    ready.put(rank)
    go.wait()
    start = time.perf_counter()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    dist.barrier()
    took = time.perf_counter() - start
    requests = -1
    if lib == "ringtorch":
        from ringtorch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store()
        while hasattr(store, "underlying_store"):
            store = store.underlying_store
        requests = store.statistics().requests if hasattr(store, "statistics") else -1
    out.put((rank, took, requests))
    dist.barrier()  # nobody leaves (taking the store with it) before every rank measured
    dist.destroy_process_group()


def run_world(lib: str, world: int, agent_store: bool = False) -> tuple[float, int]:
    """One start-up of ``world`` ranks: (slowest rank's seconds, most requests of a rank)."""
    ctx = mp.get_context("spawn")
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    store = None
    if agent_store:
        from ringtorch.store import TCPStore

        store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = store.port if store is not None else _free_port()
    procs = [ctx.Process(target=_rank, args=(lib, r, world, port, ready, go, out, agent_store))
             for r in range(world)]
    for proc in procs:
        proc.start()
    for _ in range(world):
        ready.get(timeout=600)  # spawning 32 ranks that import torch, on 2 loaded cores
    go.set()
    results = []
    while len(results) < world:  # a rank that dies ends the run instead of hanging it
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"{lib} world {world}: a rank exited with {dead[0]}") from None
    for proc in procs:
        proc.join(60)
    if store is not None:
        store.close()
    return max(r[1] for r in results), max(r[2] for r in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--libs", nargs="+", default=list(LIBS), choices=LIBS)
    parser.add_argument("--json", help="also write the results here (bench/_report.py)")
    parser.add_argument("--cold", action="store_true",
                        help="do not compile the measured checkout to bytecode first")
    parser.add_argument("--agent-store", action="store_true",
                        help="serve the store from this process; every rank is a client "
                             "(ringtorch only)")
    args = parser.parse_args()
    if args.agent_store and "gloo" in args.libs:
        parser.error("--agent-store needs --libs ringtorch (torch's clients cannot use "
                     "ringtorch's store)")
    recorder = Recorder("init")
    import ringtorch

    if not args.cold:  # as installed: bytecode is written even under PYTHONDONTWRITEBYTECODE
        compileall.compile_dir(os.path.dirname(ringtorch.__file__), quiet=1)
    print(f"ringtorch from {os.path.dirname(ringtorch.__file__)}"
          f"{' (compiled from source by every rank)' if args.cold else ''}; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, dict[str, Any]] = {}
    print(f"{'world':>5}  {'ringtorch s':>11}  {'gloo s':>8}  {'ratio':>6}  {'requests/rank':>13}")
    for world in args.world_sizes:
        row: dict[str, Any] = {}
        for lib in args.libs:
            runs = [run_world(lib, world, args.agent_store) for _ in range(args.rounds)]
            row[lib] = {"seconds": [t for t, _ in runs], "median_s": statistics.median(
                t for t, _ in runs), "requests_per_rank": max(n for _, n in runs)}
        results[str(world)] = row
        rt, gl = row.get("ringtorch"), row.get("gloo")
        ratio = f"{rt['median_s'] / gl['median_s']:6.2f}" if rt and gl else "     -"
        print(f"{world:>5}  {rt['median_s'] if rt else float('nan'):>11.2f}  "
              f"{gl['median_s'] if gl else float('nan'):>8.2f}  {ratio}  "
              f"{rt['requests_per_rank'] if rt else '-':>13}", flush=True)
    recorder.write(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

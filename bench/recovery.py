"""Time from a SIGKILL of one of N ranks to the survivors' next completed training step.

For each N, N ranks train a small MLP with DDP (SGD), and this process SIGKILLs the last rank
during a step. ringtorch: the survivors catch the error, call ``shrink_on_failure``, re-wrap
DDP and go on; measured: the kill to the first step completed at world N - 1. torch (gloo, its
default 30-minute timeout): measured, how long the survivors take to raise and what they raise
(capped at ``--cap-s``); torch cannot shrink a gloo group (``shrink_group`` is NCCL-only), so
its way on is a restart: N - 1 fresh processes that initialize, wrap DDP and complete one step,
started as soon as the survivors have raised (no checkpoint is loaded, no launcher's monitoring
interval is paid: a lower bound of torchrun's restart). The ratio is torch's restart over
ringtorch's shrink.

Grow back (ringtorch only; torch's launcher can only restart every worker): after the shrink,
this process starts a replacement for the killed rank with RINGTORCH_JOIN=1, as ringrun does;
the survivors admit it at a step boundary (``admit_joiners``, once per step), DDP re-wraps and
the optimizer state is broadcast. Measured in the replacement: from its first line of user code
(after its imports and torch's lazy start-up: its first optimizer imports torch._dynamo) to its
first step completed at world N (the goal: 5 s), and, apart, its Python and torch start-up
(process start to that first line).

    python bench/recovery.py                  # N = 2, 3, 4; 3 runs each; two tables
    python bench/recovery.py --sizes 4 --repeats 5 --grow-sizes 4
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import signal
import statistics
import time
from datetime import timedelta
from typing import Any

import torch
from torch import nn


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def _library(lib: str) -> tuple[Any, Any]:
    if lib == "ringtorch":
        import ringtorch.distributed as dist
        from ringtorch.nn.parallel import DistributedDataParallel
        return dist, DistributedDataParallel
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    return dist, DistributedDataParallel


def worker(lib: str, mode: str, rank: int, world: int, signal_port: int, master_port: int,
           tag: str, kill_at: int, steps: int) -> None:
    """One rank. ``mode`` "train": train ``steps`` steps, the last rank waiting to be killed at
    ``kill_at``; "restart": a fresh rank of the smaller world, one step."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(master_port))
    if lib == "ringtorch":  # the store lives in the bench process, so any rank may die
        os.environ.update(MASTER_PORT=str(signal_port), TORCHELASTIC_USE_AGENT_STORE="True")
    from ringtorch.distributed import TCPStore

    sig = TCPStore("127.0.0.1", signal_port, is_master=False)
    dist, ddp_class = _library(lib)
    dist.init_process_group("gloo")
    ddp = ddp_class(_mlp())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    step, recovering = 0, False
    while step < (1 if mode == "restart" else steps):
        if mode == "train" and rank == world - 1 and step == kill_at:
            sig.set(f"{tag}/victim", str(os.getpid()))
            time.sleep(600)
        try:
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        except Exception as exc:
            sig.set(f"{tag}/error/{rank}", json.dumps(
                [time.time(), type(exc).__name__, (str(exc).splitlines() or [""])[0]]))
            if lib != "ringtorch":
                os._exit(1)  # the job cannot go on: a launcher would restart it
            dist.shrink_on_failure(exc)
            ddp, recovering = ddp.rewrap(), True
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            continue
        step += 1
        if dist.get_rank() == 0 and (recovering or mode == "restart"):
            sig.set(f"{tag}/next_step", repr(time.time()))
            recovering = False
    os._exit(0)  # the measurement is over: skip the interpreter's shutdown


def grow_worker(rank: int, world: int, port: int, tag: str, kill_at: int, joiner: bool,
                step_s: float) -> None:
    """One rank of the grow-back run: train (a step takes at least ``step_s``), the last rank
    dies at ``kill_at``, the survivors shrink and admit its replacement (``joiner``), then
    every rank does 3 steps at world N."""
    import ringtorch.distributed as dist
    from ringtorch.nn.parallel import DistributedDataParallel

    # torch's start-up ends at its first optimizer, which imports torch._dynamo (1-4 s here)
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    user_code_at = time.time()  # Python, torch and ringtorch are started: the program begins
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), TORCHELASTIC_USE_AGENT_STORE="True",
                      RINGTORCH_JOIN="1" if joiner else "0")
    sig = dist.TCPStore("127.0.0.1", port, is_master=False)
    dist.init_process_group("gloo")
    phases = [time.time()]  # the joiner: joined, DDP made, optimizer state received
    ddp = DistributedDataParallel(_mlp())
    phases.append(time.time())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    step, after = 0, 0 if joiner else -1  # steps done at world N since the admission
    if joiner:
        dist.broadcast_optimizer_state(opt)
        phases.append(time.time())
    while after < 3 and step < 100_000:
        began = time.monotonic()
        if not joiner and rank == world - 1 and step == kill_at:
            sig.set(f"{tag}/victim", str(os.getpid()))
            time.sleep(600)
        try:
            if not (joiner and after == 0) and dist.admit_joiners() is not None:
                ddp, after = ddp.rewrap(), 0
                dist.broadcast_optimizer_state(opt)
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
        except dist.DistError as exc:
            dist.shrink_on_failure(exc)
            ddp = ddp.rewrap()
            sig.set(f"{tag}/shrunk/{dist.get_rank()}", "1")
            continue
        step += 1
        if after >= 0:
            after += 1
        if joiner and after == 1:
            sig.set(f"{tag}/grown", json.dumps([_process_start(), user_code_at, time.time(),
                                                  phases]))
        time.sleep(max(0.0, step_s - (time.monotonic() - began)))
    os._exit(0)


def _process_start() -> float:
    """This process's start (wall clock), from /proc."""
    with open("/proc/self/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    with open("/proc/uptime") as fh:
        uptime = float(fh.read().split()[0])
    return time.time() - uptime + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def measure_grow(world: int, run: int, step_s: float) -> dict[str, Any]:
    """One grow-back run at ``world``: the replacement's start-up and its time to world N."""
    from ringtorch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = multiprocessing.get_context("spawn")
    tag = f"grow/{world}/{run}"
    procs = [ctx.Process(target=grow_worker, args=(r, world, store.port, tag, 5, False, step_s),
                         daemon=True) for r in range(world)]
    for proc in procs:
        proc.start()
    try:
        _wait_key(store, f"{tag}/victim", 300)
        os.kill(int(store.get(f"{tag}/victim")), signal.SIGKILL)
        for r in range(world - 1):
            _wait_key(store, f"{tag}/shrunk/{r}", 60)
        joiner = ctx.Process(target=grow_worker, daemon=True,
                             args=(world - 1, world, store.port, tag, 5, True, step_s))
        launched = time.time()
        joiner.start()
        procs.append(joiner)
        got = _wait_key(store, f"{tag}/grown", 120)
    finally:
        _stop(procs)
    if got is None:
        return {"startup_s": None, "grow_s": None, "launch_to_whole_s": None, "phases_s": None}
    started, user_code, whole, phases = json.loads(got)
    # where the grow-back time goes: joining (init_process_group), DDP (rank 0's parameters),
    # the optimizer state, the first step
    marks = [user_code, *phases, whole]
    return {"startup_s": user_code - started, "grow_s": whole - user_code,
            "launch_to_whole_s": whole - launched,
            "phases_s": [round(b - a, 3) for a, b in zip(marks, marks[1:], strict=False)]}


def _start(ctx: Any, lib: str, mode: str, world: int, signal_port: int, master_port: int,
           tag: str, kill_at: int, steps: int) -> list[Any]:
    procs = [ctx.Process(target=worker, args=(lib, mode, r, world, signal_port, master_port,
                                              tag, kill_at, steps), daemon=True)
             for r in range(world)]
    for proc in procs:
        proc.start()
    return procs


def _stop(procs: list[Any]) -> None:
    for proc in procs:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)


def _wait_key(store: Any, key: str, timeout_s: float) -> bytes | None:
    try:
        store.wait([key], timedelta(seconds=timeout_s))
    except Exception:
        return None
    return store.get(key)


def measure(lib: str, world: int, run: int, cap_s: float) -> dict[str, Any]:
    """One run: kill the last of ``world`` ranks; what the survivors did, in seconds."""
    from ringtorch.distributed import TCPStore
    from ringtorch.testing import free_port

    # a store of its own per run: ringtorch's ranks meet in it (init_process_group counts
    # its incarnations there per rank, so runs of different sizes must not share one)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ctx = multiprocessing.get_context("spawn")
    tag = f"{lib}/{world}/{run}"
    procs = _start(ctx, lib, "train", world, store.port, free_port(), tag, 5, 10)
    try:
        _wait_key(store, f"{tag}/victim", 300)
        killed = time.time()
        os.kill(int(store.get(f"{tag}/victim")), signal.SIGKILL)
        errors = [_wait_key(store, f"{tag}/error/{r}", cap_s) for r in range(world - 1)]
        raised = [json.loads(e) for e in errors if e is not None]
        result: dict[str, Any] = {
            "raised_s": max(e[0] for e in raised) - killed if len(raised) == world - 1 else None,
            "error": raised[0][1:] if raised else None}
        if lib == "ringtorch":
            got = _wait_key(store, f"{tag}/next_step", cap_s)
            result["next_step_s"] = None if got is None else float(got) - killed
            return result
    finally:
        _stop(procs)
    # torch: a restart of the smaller world, begun once the survivors have raised
    restart = _start(ctx, lib, "restart", world - 1, store.port, free_port(), tag + "/r", 0, 1)
    try:
        got = _wait_key(store, f"{tag}/r/next_step", 300)
        result["next_step_s"] = None if got is None else float(got) - killed
    finally:
        _stop(restart)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[2, 3, 4],
                        help="measure the shrink at these world sizes (none: skip it)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grow-sizes", type=int, nargs="*", default=[4],
                        help="measure the grow back at these world sizes (none: skip it)")
    parser.add_argument("--step-s", type=float, default=0.05,
                        help="grow back: a training step takes at least this long (a real "
                             "model's compute; the survivors do not spin on the CPU the "
                             "replacement starts on)")
    parser.add_argument("--cap-s", type=float, default=60.0,
                        help="stop waiting for torch's survivors to raise after this long")
    args = parser.parse_args(argv)
    rows = []
    for world in args.sizes:
        runs = {lib: [measure(lib, world, i, args.cap_s) for i in range(args.repeats)]
                for lib in ("ringtorch", "torch")}
        rows.append((world, runs))
        print(json.dumps({"world": world, "runs": runs}), flush=True)
    _print_shrink(rows, args.cap_s)
    _print_grow([(world, [measure_grow(world, i, args.step_s) for i in range(args.repeats)])
                 for world in args.grow_sizes])
    return 0


def _print_shrink(rows: list[tuple[int, dict[str, Any]]], cap_s: float) -> None:
    if not rows:
        return
    print()
    print("| N | ringtorch: kill -> next step at N-1 (s) | torch gloo: survivors raise (s) | "
          "torch gloo: what they raise | torch: restart at N-1, first step (s) | torch / "
          "ringtorch |")
    print("|---|---|---|---|---|---|")
    for world, runs in rows:
        ring = _median([r["next_step_s"] for r in runs["ringtorch"]])
        raised = _median([r["raised_s"] for r in runs["torch"]])
        restart = _median([r["next_step_s"] for r in runs["torch"]])
        error = runs["torch"][0]["error"]
        # gloo's messages start with its source file: "[.../pair.cc:553] Connection closed..."
        text = re.sub(r"^\[[^\]]*\] ", "", error[1]) if error else ""
        what = f"{error[0]}: {text[:60]}" if error else f"nothing within {cap_s:g} s"
        ratio = f"{restart / ring:.1f}x" if ring and restart else "-"
        print(f"| {world} | {_fmt(ring)} | {_fmt(raised)} | {what} | {_fmt(restart)} | "
              f"{ratio} |")


def _print_grow(grown: list[tuple[int, list[dict[str, Any]]]]) -> None:
    for world, runs in grown:
        print(json.dumps({"grow_world": world, "runs": runs}), flush=True)
    if not grown:
        return
    print()
    print("| N | replacement: first line of user code -> first step at N (s) | its Python "
          "and torch start-up (s) | its start -> first step at N (s) |")
    print("|---|---|---|---|")
    for world, runs in grown:
        print(f"| {world} | {_fmt(_median([r['grow_s'] for r in runs]))} | "
              f"{_fmt(_median([r['startup_s'] for r in runs]))} | "
              f"{_fmt(_median([r['launch_to_whole_s'] for r in runs]))} |")


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


if __name__ == "__main__":
    raise SystemExit(main())

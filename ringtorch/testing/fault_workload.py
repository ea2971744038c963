"""One rank of a fault-matrix workload: the same program for ringtorch and for torch.

Run by path, never imported by ringtorch (``python fault_workload.py LIB WORKLOAD RANK WORLD
ADDR PORT OUT TIMEOUT_S``): with LIB ``torch`` it imports ``torch.distributed`` only, so the
torch column measures torch alone. WORKLOAD is ``all_reduce`` (a loop of checked all_reduces),
``ddp`` (DistributedDataParallel training of a small model) or ``rpc`` (``rpc_sync`` calls to
every other worker in turn). The rule it keeps: a rank writes ``OUT/rank<R>.ready`` once it has
run a few checked steps, then loops until something fails, and writes what failed to
``OUT/rank<R>.json`` (exception type, whether it is a ``DistError``, message, the
``time.monotonic()`` when it was caught, and the warnings logged meanwhile) before it exits
the way a user's script would: by letting the exception end the interpreter. Steps are paced
(a few milliseconds apart, as training steps with compute between them would be) so that the
fault injector and the measurements get the CPU on a small machine.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

WORKLOADS = ("all_reduce", "ddp", "rpc")
READY_AFTER_STEPS = 10
PACE_S = 0.005


class _Warnings(logging.Handler):
    """Every warning logged by the library, with the monotonic time it was logged at."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((time.monotonic(), record.getMessage()[:2000]))


def _write_json(path: str, payload: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, path)


def _steps_all_reduce(dist: Any, torch: Any, rank: int, world: int) -> Any:
    expected = float(sum(range(1, world + 1)))
    while True:
        t = torch.full((16384,), float(rank + 1))
        dist.all_reduce(t)
        if not bool((t == expected).all()):
            raise AssertionError(f"all_reduce gave {t[:4]}, expected {expected}")
        yield


def _steps_ddp(dist: Any, torch: Any, rank: int, world: int, ddp_class: Any) -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 8))
    ddp = ddp_class(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    while True:
        x = torch.randn(32, 64, generator=gen)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        yield


def _steps_rpc(rpc: Any, torch: Any, rank: int, world: int) -> Any:
    peers = [r for r in range(world) if r != rank]
    step = 0
    while True:
        peer = peers[step % len(peers)]
        got = rpc.rpc_sync(f"worker{peer}", torch.add, args=(torch.ones(1024), rank))
        if float(got[0]) != rank + 1.0:
            raise AssertionError(f"worker{peer} returned {float(got[0])}, expected {rank + 1}")
        step += 1
        yield


def _start(lib: str, workload: str, rank: int, world: int, url: str, timeout_s: float) -> Any:
    """Initialise the library for ``workload``; returns the generator of its steps."""
    import torch

    if lib == "torch":
        dist = importlib.import_module("torch.distributed")
        ddp_class = torch.nn.parallel.DistributedDataParallel
    else:
        dist = importlib.import_module("ringtorch.distributed")
        ddp_class = importlib.import_module("ringtorch.nn.parallel").DistributedDataParallel
    if workload == "rpc":
        rpc = importlib.import_module(f"{dist.__name__}.rpc")
        options = rpc.TensorPipeRpcBackendOptions(init_method=url, rpc_timeout=timeout_s)
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world, rpc_backend_options=options)
        return dist, _steps_rpc(rpc, torch, rank, world)
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    if workload == "ddp":
        return dist, _steps_ddp(dist, torch, rank, world, ddp_class)
    return dist, _steps_all_reduce(dist, torch, rank, world)


def main(argv: list[str]) -> int:
    lib, workload, rank_s, world_s, addr, port, out, timeout_s = argv
    if lib not in ("ringtorch", "torch") or workload not in WORKLOADS:
        raise SystemExit(f"usage: LIB (ringtorch|torch) WORKLOAD {WORKLOADS} ...; got {argv}")
    rank, world = int(rank_s), int(world_s)
    warnings = _Warnings()
    logging.getLogger().addHandler(warnings)
    logging.getLogger().setLevel(logging.WARNING)
    base = os.path.join(out, f"rank{rank}")
    record: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "steps": 0}
    dist = None
    try:
        dist, steps = _start(lib, workload, rank, world, f"tcp://{addr}:{port}",
                             float(timeout_s))
        for _ in steps:
            record["steps"] += 1
            if record["steps"] == READY_AFTER_STEPS:
                _write_json(f"{base}.ready", {"t": time.monotonic()})
            time.sleep(PACE_S)
    except BaseException as exc:  # what the workload ended with is the measurement
        caught = time.monotonic()
        dist_error = getattr(dist, "DistError", None) if dist is not None else None
        record.update(
            t_error=caught, type=f"{type(exc).__module__}.{type(exc).__qualname__}",
            dist_error=bool(dist_error is not None and isinstance(exc, dist_error)),
            message=str(exc)[:4000], traceback=traceback.format_exc()[-4000:],
            warnings=warnings.seen)
        _write_json(f"{base}.json", record)
        raise
    return 0  # unreachable: the steps never end


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

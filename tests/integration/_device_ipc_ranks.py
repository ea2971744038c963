"""Rank-side code of tests/integration/test_device_ipc.py: all_reduce of device tensors over
the IPC path (the process's runtime: ``sim`` or ``cuda``, from RINGTORCH_DEVICE_RUNTIME).

Inputs are ``values(rank, n, dtype)``, a pure function, so the driver rebuilds them and
computes the expected sums with NumPy. Tensors are filled and read by work queued on the
current stream; on the simulator every stream op is delayed by a random few milliseconds so
that a missing wait shows as a wrong result.
"""

from __future__ import annotations

import gc
import os
import signal
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch

import ringtorch.distributed as dist
from ringtorch import _config
from ringtorch.distributed import _device_ipc
from tests.integration._device_staging_ranks import SLOW, _setup

SIZES = (5, 1001, 70_003)  # numel not divisible by the world; the last grows the buffer
DTYPES = ("float32", "int64", "bfloat16")


def values(rank: int, n: int, dtype: str) -> np.ndarray:
    """Small integers (sums exact in every dtype here), different per rank."""
    return ((np.arange(n) % 13) + 2 * rank - 5).astype(np.float32 if dtype == "bfloat16"
                                                        else dtype)


def _put(rt: Any, array: np.ndarray, dtype: str) -> torch.Tensor:
    src = torch.from_numpy(np.ascontiguousarray(array)).to(getattr(torch, dtype))
    t = rt.empty(tuple(src.shape), src.dtype, 0)
    rt.launch(rt.current_stream(0), lambda: t.copy_(src))
    return t


def _read(rt: Any, t: torch.Tensor) -> np.ndarray:
    out = torch.empty(t.shape, dtype=t.dtype)
    stream = rt.current_stream(0)
    rt.launch(stream, lambda: out.copy_(t))
    stream.synchronize()
    return out.float().numpy() if out.dtype is torch.bfloat16 else out.numpy()


def run(rank: int, ws: int) -> dict[str, Any]:
    """Every (size, dtype), the ordering case and the closed case; returns {case: result}."""
    rt = _setup()
    dist.init_process_group("gloo")
    out: dict[str, Any] = {"pid": os.getpid()}
    for dtype in DTYPES:
        for n in SIZES:
            t = _put(rt, values(rank, n, dtype), dtype)
            dist.all_reduce(t)
            out[f"{dtype}/{n}"] = _read(rt, t)
    out["rounds"] = _link_rounds()
    # work queued on the current stream before the call is included
    cur = rt.current_stream(0)
    t = rt.empty((7,), torch.float32, 0)
    src = torch.from_numpy(values(rank, 7, "float32"))
    rt.busy(cur, SLOW)
    rt.launch(cur, lambda: t.copy_(src))
    dist.all_reduce(t)
    out["order"] = _read(rt, t)
    # closed: today's behaviour, not this path (the sim tensor is host memory, reduced as is)
    before = _link_rounds()
    with _config.override(DEVICE_UNCONFIRMED=False):
        t = _put(rt, values(rank, 4, "float32"), "float32")
        rt.current_stream(0).synchronize()
        dist.all_reduce(t)
        out["closed"] = t.numpy().copy()
    out["closed_rounds"] = _link_rounds() - before
    dist.barrier()
    dist.destroy_process_group()
    del t
    out["leftover"] = _segments()
    return out


def _segments() -> list[str]:
    """This process's simulated device segments still named, once its groups and tensors
    are gone (the harness ends a rank with os._exit, which runs no finalizer: look now)."""
    gc.collect()
    if not os.path.isdir("/dev/shm"):
        return []
    return [name for name in os.listdir("/dev/shm")
            if name.startswith("ringtorch-sim-") and f"-{os.getpid()}-" in name]


def _link_rounds() -> int:
    links = [v for v in _device_ipc._state.links.values() if v is not None]
    return sum(link.round for link in links)


def killed(rank: int, ws: int, victim: int) -> dict[str, Any]:
    """``victim`` runs as a forked child that does two all_reduces and is SIGKILLed; the
    others loop on all_reduce and report their first error and how long it took."""
    if rank == victim:
        pid = os.fork()
        if pid == 0:
            try:
                rt = _setup()
                dist.init_process_group("gloo", timeout=timedelta(seconds=20))
                t = _put(rt, values(rank, 1000, "float32"), "float32")
                for _ in range(2):
                    dist.all_reduce(t)
                rt.current_stream(0).synchronize()  # its device work done: dies between rounds
                os.kill(os.getpid(), signal.SIGKILL)
            finally:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        return {"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                "pid": pid}
    rt = _setup()
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    t = _put(rt, values(rank, 1000, "float32"), "float32")
    start = time.monotonic()
    try:
        for _ in range(1000):
            start = time.monotonic()
            dist.all_reduce(t)
    except Exception as exc:  # the error under test
        failed = {"error": type(exc).__name__, "message": str(exc), "group": _name(),
                  "seconds": time.monotonic() - start}
    else:
        failed = {"error": None}
    dist.destroy_process_group()
    del t
    return {**failed, "leftover": _segments()}


def _name() -> str:
    from ringtorch.distributed.groups import _get_default_group

    return str(_get_default_group().group_name)

"""Rank-side code of tests/integration/test_device_ipc.py: all_reduce of device tensors over
the IPC path (the process's runtime: ``sim`` or ``cuda``, from RINGTORCH_DEVICE_RUNTIME).

Inputs are ``values(rank, n, dtype)``, a pure function, so the driver rebuilds them and
computes the expected sums with NumPy. Tensors are filled and read by work queued on the
current stream; on the simulator every stream op is delayed by a random few milliseconds so
that a missing wait shows as a wrong result.
"""

from __future__ import annotations

import contextlib
import gc
import logging
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
from ringtorch.testing import wait_for
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


class _Lines(logging.Handler):
    """The IPC module's log lines (RINGTORCH_DEBUG=INFO makes it say which path it takes)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _listen() -> _Lines:
    lines = _Lines()
    logger = logging.getLogger("ringtorch.distributed._device_ipc")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    return lines


def run(rank: int, ws: int) -> dict[str, Any]:
    """Every (size, dtype); calls that differ per rank (async on rank 0, a non-contiguous
    view on rank 1); the ordering case and the closed case; returns {case: result}."""
    earlier = _own_names()  # an earlier process's, if this pid was used before
    rt = _setup()
    lines = _listen()
    dist.init_process_group("gloo")
    out: dict[str, Any] = {"pid": os.getpid()}
    for dtype in DTYPES:
        for n in SIZES:
            t = _put(rt, values(rank, n, dtype), dtype)
            dist.all_reduce(t)
            out[f"{dtype}/{n}"] = _read(rt, t)
    out["rounds"] = _link_rounds()
    # the call's own form is no part of the path: rank 0 asynchronous, the others not; rank
    # 1 passes every other element of a larger tensor
    whole = _put(rt, np.repeat(values(rank, 9, "float32"), 2), "float32")
    t = whole[::2] if rank == 1 else _put(rt, values(rank, 9, "float32"), "float32")
    work = None
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        out["async_returned"] = work is not None
        work.wait()
    else:
        dist.all_reduce(t)
    out["mixed"] = _read(rt, t)
    out["untouched"] = _read(rt, whole[1::2]) if rank == 1 else None
    out["mixed_rounds"] = _link_rounds() - out["rounds"]
    # AVG of floating point: the sum divided on the device, one round too
    t = _put(rt, values(rank, 11, "float32"), "float32")
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    out["avg"] = _read(rt, t)
    out["avg_rounds"] = _link_rounds() - out["rounds"] - out["mixed_rounds"]
    # broadcast (rank 0 asynchronous) and an all_gather of uneven sizes (rank 1 async)
    before = _link_rounds()
    b = _put(rt, values(rank, 1001, "float32"), "float32")
    if rank == 0:
        dist.broadcast(b, src=ws - 1, async_op=True).wait()
    else:
        dist.broadcast(b, src=ws - 1)
    out["broadcast"] = _read(rt, b)
    g = _put(rt, values(rank, 3 + 2 * rank, "int64"), "int64")
    outs = [_put(rt, np.full(3 + 2 * r, -1, dtype=np.int64), "int64") for r in range(ws)]
    if rank == 1:
        dist.all_gather(outs, g, async_op=True).wait()
    else:
        dist.all_gather(outs, g)
    out["all_gather"] = [_read(rt, o) for o in outs]
    out["bcast_gather_rounds"] = _link_rounds() - before
    del b, g, outs
    # work queued on the current stream before the call is included
    cur = rt.current_stream(0)
    q = rt.empty((7,), torch.float32, 0)
    src = torch.from_numpy(values(rank, 7, "float32"))
    rt.busy(cur, SLOW)
    rt.launch(cur, lambda q=q: q.copy_(src))
    dist.all_reduce(q)
    out["order"] = _read(rt, q)
    # closed: today's behaviour, not this path (the sim tensor is host memory, reduced as is)
    before = _link_rounds()
    with _config.override(DEVICE_UNCONFIRMED=False):
        c = _put(rt, values(rank, 4, "float32"), "float32")
        rt.current_stream(0).synchronize()
        dist.all_reduce(c)
        out["closed"] = c.numpy().copy()
    out["closed_rounds"] = _link_rounds() - before
    out["paths"] = dict(_device_ipc._state.paths)
    out["log"] = lines.lines
    dist.barrier()
    dist.destroy_process_group()
    del t, whole, q, c, work
    out["leftover"] = _segments(earlier)
    return out


def two_hosts(rank: int, ws: int) -> dict[str, Any]:
    """Ranks 0-1 say they are on one host, the others on another: the staging path, the
    same on every rank, and the right sums."""
    os.environ.update({"RINGTORCH_HOST_ID": f"host-{min(rank // 2, 1)}",
                       "RINGTORCH_SOCKET_ADDR": "127.0.0.1"})
    rt = _setup()
    lines = _listen()
    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    for n in (5, 1001):
        t = _put(rt, values(rank, n, "float32"), "float32")
        dist.all_reduce(t)
        out[f"float32/{n}"] = _read(rt, t)
    t = _put(rt, values(rank, 5, "int64"), "int64")
    dist.all_reduce(t, async_op=True).wait()
    out["async"] = _read(rt, t)
    out["rounds"] = _link_rounds()
    out["paths"] = dict(_device_ipc._state.paths)
    out["log"] = lines.lines
    dist.destroy_process_group()
    return out


def _own_names() -> set[str]:
    """Simulated device segments in /dev/shm named with this process's pid. Some may be an
    earlier process's: a rank the harness ends with os._exit (no finalizer runs) or a killed
    one leaves its segments, and pids are reused (32,768 of them here)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {name for name in os.listdir("/dev/shm")
            if name.startswith("ringtorch-sim-") and f"-{os.getpid()}-" in name}


def _segments(earlier: set[str]) -> list[str]:
    """This process's simulated device segments still named, once its groups and tensors
    are gone (the harness ends a rank with os._exit, which runs no finalizer: look now);
    ``earlier``: the names of an earlier process with this pid, present before this one made
    any. Worker threads (the group's IPC thread, stream workers) drop their last references
    just after waking the caller: wait for the names to go (up to 30 s: on a loaded machine
    those threads may not run for seconds; a leak still fails)."""
    def left() -> list[str]:
        gc.collect()
        return sorted(_own_names() - earlier)

    with contextlib.suppress(TimeoutError):
        wait_for(lambda: not left(), timeout=30.0, what="device segments released",
                 interval=0.05)
    return left()


def _link_rounds() -> int:
    links = [v for v in _device_ipc._state.links.values() if v is not None]
    return sum(link.round for link in links)


def _die_mid_round() -> None:
    """In the victim: SIGKILL itself in its third round, after its input is published and
    before it has read its peers' (they are then mid-round with it)."""
    wait_keys = _device_ipc._Link.wait_keys

    def dying(self: Any, what: str, keys: dict[int, str]) -> None:
        if what == "its input" and self.round == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        wait_keys(self, what, keys)

    _device_ipc._Link.wait_keys = dying  # type: ignore[method-assign]


def killed(rank: int, ws: int, victim: int) -> dict[str, Any]:
    """``victim`` runs as a forked child that dies in its third all_reduce; the others loop
    on all_reduce and report their first error and how long it took."""
    if rank == victim:
        pid = os.fork()
        if pid == 0:
            try:
                rt = _setup()
                _die_mid_round()
                dist.init_process_group("gloo", timeout=timedelta(seconds=20))
                t = _put(rt, values(rank, 1000, "float32"), "float32")
                for _ in range(3):
                    dist.all_reduce(t)
            finally:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        return {"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                "pid": pid}
    earlier = _own_names()  # an earlier process's, if this pid was used before
    rt = _setup()
    dist.init_process_group("gloo", timeout=timedelta(seconds=20))
    t = _put(rt, values(rank, 1000, "float32"), "float32")
    start = time.monotonic()
    rounds = 0
    try:
        for rounds in range(1000):  # noqa: B007 (read after the loop)
            start = time.monotonic()
            dist.all_reduce(t)
    except Exception as exc:  # the error under test
        failed = {"error": type(exc).__name__, "message": str(exc), "group": _name(),
                  "seconds": time.monotonic() - start, "rounds": rounds}
    else:
        failed = {"error": None}
    dist.destroy_process_group()
    del t
    return {**failed, "leftover": _segments(earlier)}


def _name() -> str:
    from ringtorch.distributed.groups import _get_default_group

    return str(_get_default_group().group_name)

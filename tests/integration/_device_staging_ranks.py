"""Rank-side code of tests/integration/test_device_staging.py: collectives and p2p on device
tensors (the process's device runtime: ``sim`` or ``cuda``, from RINGTORCH_DEVICE_RUNTIME).

Inputs are ``values(rank, n, salt)``, a pure function, so the driver rebuilds every rank's
inputs and computes the expected results with NumPy. Every device tensor is filled by work
queued on the current stream and read back by work queued on it (``_read``), so a staged
operation that ignores the caller's stream reads or leaves stale data. On the simulator
every stream op is delayed by a random few milliseconds, so unordered work finishes out of
order.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import numpy as np
import torch

import ringtorch.distributed as dist
from ringtorch import _config, _device
from ringtorch.distributed import _device_staging
from ringtorch.distributed.groups import _get_default_store

SLOW = 0.4  # seconds a stream is kept busy where a case must see it still running


def values(rank: int, n: int, salt: int) -> np.ndarray:
    """Small integers (sums exact in float32), different per rank and salt."""
    return (np.arange(n) * (salt % 7 + 1) + 3 * rank - salt % 5).astype(np.float32)


class _Dev:
    """Device tensors on GPU 0 of the process's runtime, written and read in stream order."""

    def __init__(self, rt: Any) -> None:
        self.rt = rt

    def put(self, array: np.ndarray) -> torch.Tensor:
        t = self.rt.empty(tuple(array.shape), torch.float32, 0)
        src = torch.from_numpy(np.ascontiguousarray(array))
        self.rt.launch(self.rt.current_stream(0), lambda: t.copy_(src))
        return t

    def blank(self, n: int) -> torch.Tensor:
        return self.put(np.full(n, -1.0, dtype=np.float32))

    def read(self, t: torch.Tensor) -> np.ndarray:
        out = torch.empty(t.shape, dtype=t.dtype)
        stream = self.rt.current_stream(0)
        self.rt.launch(stream, lambda: out.copy_(t))
        stream.synchronize()
        return out.numpy()


def _setup() -> Any:
    rt = _device.runtime()
    if rt.name == "sim":
        rng = random.Random()
        lock = threading.Lock()

        def delay(kind: str) -> float:
            with lock:
                return rng.uniform(0.0, 0.004)

        rt.delay = delay  # before the first stream is made: every stream takes it
    return rt


def run(rank: int, ws: int) -> dict[str, Any]:
    """Every operation sync and async, the ordering cases and the closed feature; returns
    {case: numpy result}."""
    rt = _setup()
    dist.init_process_group("gloo")
    d = _Dev(rt)
    out: dict[str, Any] = {"runtime": rt.name}
    n = 6
    for mode in ("sync", "async"):
        aop = mode == "async"

        def done(work: Any, aop: bool = aop) -> None:
            if aop:
                work.wait()
            else:
                assert work is None

        t = d.put(values(rank, n, 1))
        done(dist.all_reduce(t, async_op=aop))
        out[f"{mode}/all_reduce"] = d.read(t)
        t = d.put(values(rank, n, 2))
        done(dist.broadcast(t, src=ws - 1, async_op=aop))
        out[f"{mode}/broadcast"] = d.read(t)
        t = d.put(values(rank, n, 3))
        done(dist.reduce(t, dst=0, async_op=aop))
        out[f"{mode}/reduce"] = d.read(t)
        t, outs = d.put(values(rank, n, 4)), [d.blank(n) for _ in range(ws)]
        done(dist.all_gather(outs, t, async_op=aop))
        out[f"{mode}/all_gather"] = [d.read(o) for o in outs]
        t, whole = d.put(values(rank, n, 5)), d.blank(n * ws)
        done(dist.all_gather_single(whole, t, async_op=aop))
        out[f"{mode}/all_gather_into_tensor"] = d.read(whole)
        t = d.put(values(rank, n, 6))
        outs = [d.blank(n) for _ in range(ws)] if rank == 0 else None
        done(dist.gather(t, outs, dst=0, async_op=aop))
        out[f"{mode}/gather"] = [d.read(o) for o in outs] if outs else None
        t = d.blank(n)
        ins = [d.put(values(r, n, 7)) for r in range(ws)] if rank == 0 else None
        done(dist.scatter(t, ins, src=0, async_op=aop))
        out[f"{mode}/scatter"] = d.read(t)
        t, ins = d.blank(n), [d.put(values(rank, n, 8 + r)) for r in range(ws)]
        done(dist.reduce_scatter(t, ins, async_op=aop))
        out[f"{mode}/reduce_scatter"] = d.read(t)
        t, whole = d.blank(n), d.put(values(rank, n * ws, 20))
        done(dist.reduce_scatter_single(t, whole, async_op=aop))
        out[f"{mode}/reduce_scatter_tensor"] = d.read(t)
        outs, ins = [d.blank(n) for _ in range(ws)], [d.put(values(rank, n, 30 + r))
                                                        for r in range(ws)]
        done(dist.all_to_all(outs, ins, async_op=aop))
        out[f"{mode}/all_to_all"] = [d.read(o) for o in outs]
        t, whole = d.blank(n * ws), d.put(values(rank, n * ws, 40))
        done(dist.all_to_all_single(t, whole, async_op=aop))
        out[f"{mode}/all_to_all_single"] = d.read(t)
        if ws > 1:
            nxt, prv = (rank + 1) % ws, (rank - 1) % ws
            t, got = d.put(values(rank, n, 50)), d.blank(n)
            if aop:
                sent, recvd = dist.isend(t, dst=nxt), dist.irecv(got, src=prv)
                sent.wait()
                recvd.wait()
            else:
                dist.send(t, dst=nxt)
                out["sync/recv_returns"] = dist.recv(got, src=prv)
            out[f"{mode}/send_recv"] = d.read(got)
    _coalesced(rank, ws, d, out)
    if ws > 1:
        _batch(rank, ws, d, out)
    # the ordering cases keep streams busy for a while: worlds 1 and 2 are enough for them
    if ws == 2:
        _ordering_across_ranks(rank, ws, rt, d, out)
    if ws <= 2:
        _ordering_local(rank, ws, rt, d, out)
        _closed(rank, ws, rt, d, out)
    dist.destroy_process_group()
    return out


def _coalesced(rank: int, ws: int, d: _Dev, out: dict[str, Any]) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ts = [d.put(values(rank, 4, 60)), d.put(values(rank, 3, 61))]
        dist.all_reduce_coalesced(ts)
        out["coalesced/all_reduce"] = [d.read(t) for t in ts]
        ts = [d.put(values(rank, 4, 62)), d.put(values(rank, 3, 63))]
        fut = dist.all_reduce_coalesced(ts, async_op=True)
        fut.wait()
        out["coalesced/all_reduce_async"] = [d.read(t) for t in ts]
        ins = [d.put(values(rank, 2, 64)), d.put(values(rank, 3, 65))]
        outs = [[d.blank(2), d.blank(3)] for _ in range(ws)]  # one list per rank
        dist.all_gather_coalesced(outs, ins)
        out["coalesced/all_gather"] = [[d.read(o) for o in lst] for lst in outs]


def _batch(rank: int, ws: int, d: _Dev, out: dict[str, Any]) -> None:
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    t, got = d.put(values(rank, 5, 70)), d.blank(5)
    works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, prv),
                                    dist.P2POp(dist.isend, t, nxt)])
    for work in works:
        work.wait()
    out["batch_isend_irecv"] = d.read(got)


def _ordering_local(rank: int, ws: int, rt: Any, d: _Dev, out: dict[str, Any]) -> None:
    # work queued on the current stream before the call (a slow kernel, then the fill) is
    # what the operation reduces
    cur = rt.current_stream(0)
    t = rt.empty((4,), torch.float32, 0)
    src = torch.from_numpy(values(rank, 4, 80))
    rt.busy(cur, SLOW)
    rt.launch(cur, lambda: t.copy_(src))
    dist.all_reduce(t)
    out["order/queued_work_included"] = d.read(t)
    # a second stream: its own queued work, its own result; the first stream's too
    side = rt.new_stream(0)
    t1 = rt.empty((4,), torch.float32, 0)
    t2 = rt.empty((4,), torch.float32, 0)
    src1, src2 = torch.from_numpy(values(rank, 4, 81)), torch.from_numpy(values(rank, 4, 82))
    rt.launch(cur, lambda: t1.copy_(src1))
    dist.all_reduce(t1)
    with rt.use_stream(side):
        rt.busy(side, SLOW)
        rt.launch(side, lambda: t2.copy_(src2))
        work = dist.all_reduce(t2, async_op=True)
        work.wait()
        out["order/second_stream"] = d.read(t2)
    out["order/first_stream"] = d.read(t1)


def _ordering_across_ranks(rank: int, ws: int, rt: Any, d: _Dev, out: dict[str, Any]) -> None:
    """Rank 0 makes its staging stream slow *after* its call returned and before the peers
    join (they wait for a store key): the copy-back then comes behind the slow kernel."""
    store = _get_default_store()
    staging = _device_staging.staging_stream(rt, 0)
    # async: wait() returns before the copy-back is done; later work on the stream sees it
    t = d.put(values(rank, 4, 90))
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        rt.busy(staging, SLOW)
        store.set("staging/slow1", "1")
        start = time.monotonic()
        work.wait()
        out["order/wait_returned_while_copy_back_pending"] = not staging.query()
        out["order/wait_seconds"] = time.monotonic() - start
        out["order/async_result"] = d.read(t)
        # the caller drops its tensor after wait(); new memory used on the stream is its own
        t = d.put(values(rank, 4, 91))
        work2 = dist.all_reduce(t, async_op=True)
        rt.busy(staging, SLOW)
        store.set("staging/slow2", "1")
        work2.wait()
        del t
        fresh = d.put(np.full(4, 7.0, dtype=np.float32))
        out["order/after_free"] = d.read(fresh)
    else:
        store.wait(["staging/slow1"])
        dist.all_reduce(t, async_op=True).wait()
        t = d.put(values(rank, 4, 91))
        store.wait(["staging/slow2"])
        dist.all_reduce(t)
    # sync: a receive (no copy-in, so the call does not wait for the staging stream) returns
    # with the current stream ordered after its copy-back
    if rank == 1:
        got = d.blank(4)
        rt.busy(staging, SLOW)
        dist.recv(got, src=0)
        out["order/recv_returned_while_copy_back_pending"] = not staging.query()
        out["order/sync_result"] = d.read(got)
    elif rank == 0:
        dist.send(d.put(values(0, 4, 92)), dst=1)


def _closed(rank: int, ws: int, rt: Any, d: _Dev, out: dict[str, Any]) -> None:
    """The feature closed: today's behaviour (a CUDA tensor refused with today's message; a
    simulated device tensor is plain host memory, read at the call, not in stream order)."""
    with _config.override(DEVICE_UNCONFIRMED=False):
        t = d.put(np.zeros(4, dtype=np.float32))
        rt.current_stream(0).synchronize()
        if rt.name == "cuda":
            try:
                dist.all_reduce(t)
            except RuntimeError as exc:
                out["closed/error"] = str(exc)
            return
        cur = rt.current_stream(0)
        src = torch.from_numpy(values(rank, 4, 95))
        rt.busy(cur, SLOW)
        rt.launch(cur, lambda: t.copy_(src))
        dist.all_reduce(t)  # runs on the zeros: the fill lands afterwards
        out["closed/sim"] = d.read(t)

"""Rank-side code of tests/integration/test_nccl_backend.py and test_nccl_failures.py:
backend "nccl" on the process's device runtime (``sim`` with the fake NCCL, or ``cuda`` with
the library).

Inputs are ``values(rank, n, salt)`` (tests/integration/_device_staging_ranks.py), so the
driver rebuilds every rank's inputs and computes the expected results with NumPy. Device
tensors are filled and read by work queued on the current stream; on the simulator every
stream op is delayed by a random few milliseconds, so unordered work finishes out of order.
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from datetime import timedelta
from typing import Any

import torch

import ringtorch.distributed as dist
from ringtorch import _config
from ringtorch.collectives.reduce_op import make_premul_sum
from ringtorch.distributed import _device_ipc, _nccl_ops
from ringtorch.distributed.groups import _get_default_store
from ringtorch.testing import wait_for
from tests.integration._device_staging_ranks import _Dev, _setup, values

SLOW = 0.5  # seconds the current stream is kept busy where a case must see it still running
N = 6


def run(rank: int, ws: int, backend: str | None) -> dict[str, Any]:
    """Every operation sync and async on device tensors, the ordering cases and the
    dispatch by device; returns {case: numpy result}."""
    rt = _setup()
    dist.init_process_group(backend)
    d = _Dev(rt)
    out: dict[str, Any] = {"runtime": rt.name, "backend": dist.get_backend(),
                           "available": dist.is_nccl_available()}
    for mode in ("sync", "async"):
        aop = mode == "async"

        def done(work: Any, aop: bool = aop) -> None:
            if aop:
                assert work is not None
                work.wait()
            else:
                assert work is None

        t = d.put(values(rank, N, 1))
        done(dist.all_reduce(t, async_op=aop))
        out[f"{mode}/all_reduce"] = d.read(t)
        t = d.put(values(rank, N, 2))
        done(dist.broadcast(t, src=ws - 1, async_op=aop))
        out[f"{mode}/broadcast"] = d.read(t)
        t = d.put(values(rank, N, 3))
        done(dist.reduce(t, dst=0, async_op=aop))
        out[f"{mode}/reduce"] = d.read(t)
        t, outs = d.put(values(rank, N, 4)), [d.blank(N) for _ in range(ws)]
        done(dist.all_gather(outs, t, async_op=aop))
        out[f"{mode}/all_gather"] = [d.read(o) for o in outs]
        t, whole = d.put(values(rank, N, 5)), d.blank(N * ws)
        done(dist.all_gather_single(whole, t, async_op=aop))
        out[f"{mode}/all_gather_into_tensor"] = d.read(whole)
        t, ins = d.blank(N), [d.put(values(rank, N, 8 + r)) for r in range(ws)]
        done(dist.reduce_scatter(t, ins, async_op=aop))
        out[f"{mode}/reduce_scatter"] = d.read(t)
        t, whole = d.blank(N), d.put(values(rank, N * ws, 20))
        done(dist.reduce_scatter_single(t, whole, async_op=aop))
        out[f"{mode}/reduce_scatter_tensor"] = d.read(t)
        t = d.put(values(rank, N, 6))
        outs = [d.blank(N) for _ in range(ws)] if rank == 0 else None
        done(dist.gather(t, outs, dst=0, async_op=aop))
        out[f"{mode}/gather"] = [d.read(o) for o in outs] if outs else None
        t = d.blank(N)
        ins = [d.put(values(r, N, 7)) for r in range(ws)] if rank == ws - 1 else None
        done(dist.scatter(t, ins, src=ws - 1, async_op=aop))
        out[f"{mode}/scatter"] = d.read(t)
        outs, ins = [d.blank(N) for _ in range(ws)], [d.put(values(rank, N, 30 + r))
                                                        for r in range(ws)]
        done(dist.all_to_all(outs, ins, async_op=aop))
        out[f"{mode}/all_to_all"] = [d.read(o) for o in outs]
        t, whole = d.blank(N * ws), d.put(values(rank, N * ws, 40))
        done(dist.all_to_all_single(t, whole, async_op=aop))
        out[f"{mode}/all_to_all_single"] = d.read(t)
        if ws > 1:
            out.update(_send_recv(rank, ws, d, mode))
    t = d.put(values(rank, N, 11))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["max"] = d.read(t)
    t = d.put(values(rank, N, 12))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    out["avg"] = d.read(t)
    t = d.put(values(rank, N, 13))
    dist.all_reduce(t, op=make_premul_sum(2.0))
    out["premul_sum"] = d.read(t)
    out["band"] = _error(lambda: dist.all_reduce(d.put(values(rank, N, 14)),
                                                 op=dist.ReduceOp.BAND))
    out.update(_staged(rank, ws, d))
    if ws >= 3:  # a subgroup has its own communicator (its unique id under its own prefix)
        sub = dist.new_group([0, 2])
        t = d.put(values(rank, N, 15))
        if rank in (0, 2):
            dist.all_reduce(t, group=sub)
            out["subgroup"] = d.read(t)
            out["subgroup_own_side"] = sub.device_backend is not dist.group.WORLD.device_backend
    if ws <= 2:
        out.update(_ordering(rank, rt, d))
    out.update(_dispatch(rank, rt, d))
    dist.destroy_process_group()
    return out


def _staged(rank: int, ws: int, d: _Dev) -> dict[str, Any]:
    """The coalesced forms take the staged path on the group; batch_isend_irecv is one NCCL
    group of its sends and receives (in an order that would deadlock as separate calls)."""
    said: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ts = [d.put(values(rank, 4, 60)), d.put(values(rank, 3, 61))]
        dist.all_reduce_coalesced(ts)
    said["staged/all_reduce_coalesced"] = [d.read(t) for t in ts]
    if ws > 1:
        nxt, prv = (rank + 1) % ws, (rank - 1) % ws
        t, got = d.put(values(rank, 5, 70)), d.blank(5)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, prv),
                                            dist.P2POp(dist.isend, t, nxt)]):
            work.wait()
        said["batch_isend_irecv"] = d.read(got)
    return said


def _send_recv(rank: int, ws: int, d: _Dev, mode: str) -> dict[str, Any]:
    """A ring: rank r sends to r+1 and receives from r-1 (even ranks send first)."""
    nxt, prv = (rank + 1) % ws, (rank - 1) % ws
    t, got = d.put(values(rank, N, 50)), d.blank(N)
    said: dict[str, Any] = {}
    if mode == "async":
        first = dist.isend(t, dst=nxt) if rank % 2 == 0 else dist.irecv(got, src=prv)
        second = dist.irecv(got, src=prv) if rank % 2 == 0 else dist.isend(t, dst=nxt)
        first.wait()
        second.wait()
    elif rank % 2 == 0:
        dist.send(t, dst=nxt)
        said["sync/recv_returns"] = dist.recv(got, src=prv)
    else:
        said["sync/recv_returns"] = dist.recv(got, src=prv)
        dist.send(t, dst=nxt)
    said[f"{mode}/send_recv"] = d.read(got)
    return said


def _ordering(rank: int, rt: Any, d: _Dev) -> dict[str, Any]:
    """The call returns before the work queued on the current stream ran, and that work is
    included; ``wait()`` orders the current stream without blocking the host. PREMUL_SUM by
    2, so that even at world 1 a result computed before the fill differs from the right one."""
    said: dict[str, Any] = {}
    cur = rt.current_stream(0)
    t = rt.empty((4,), torch.float32, 0)
    src = torch.from_numpy(values(rank, 4, 80))
    rt.busy(cur, SLOW)
    rt.launch(cur, lambda: t.copy_(src))
    dist.all_reduce(t, op=make_premul_sum(2.0))
    said["order/sync_returned_before_queued_work"] = not cur.query()
    said["order/queued_work_included"] = d.read(t)
    t2 = rt.empty((4,), torch.float32, 0)
    src2 = torch.from_numpy(values(rank, 4, 81))
    rt.busy(cur, SLOW)
    rt.launch(cur, lambda: t2.copy_(src2))
    work = dist.all_reduce(t2, op=make_premul_sum(2.0), async_op=True)
    said["order/async_not_done_before_queued_work"] = not work.is_completed()
    work.wait()
    said["order/wait_did_not_block_host"] = not cur.query()
    said["order/after_wait"] = d.read(t2)  # read on the current stream, after the wait
    said["order/completed_after_read"] = work.is_completed()
    return said


def _dispatch(rank: int, rt: Any, d: _Dev) -> dict[str, Any]:
    """CPU tensors go to the group's CPU backend, device tensors to its NCCL side."""
    pg = dist.group.WORLD
    side = pg.device_backend
    cpu_before, nccl_before = pg._get_sequence_number_for_group(), side.seq
    c = torch.from_numpy(values(rank, N, 90))
    dist.all_reduce(c)
    cpu_moved = (pg._get_sequence_number_for_group() - cpu_before, side.seq - nccl_before)
    t = d.put(values(rank, N, 91))
    dist.all_reduce(t)
    device_moved = (pg._get_sequence_number_for_group() - cpu_before - 1,
                    side.seq - nccl_before)
    return {"dispatch/cpu_moved": cpu_moved, "dispatch/device_moved": device_moved,
            "dispatch/cpu": c.numpy(), "dispatch/device": d.read(t)}


# -- failures ---------------------------------------------------------------------------------

def _error(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def faults(rank: int, ws: int) -> dict[str, Any]:
    """A hung init aborted at the timeout; an operation past the timeout (rank 1 stalls);
    ranks sharing one GPU under NCCL 2.28 (the staged path, said once)."""
    rt = _setup()
    d = _Dev(rt)
    out: dict[str, Any] = {}
    short = timedelta(seconds=2)
    # a hung init: init_process_group with device_id makes the communicator at once
    with _config.override(NCCL_FAKE="1,hang_init"):
        started = time.monotonic()
        out["hung_init"] = _error(lambda: dist.init_process_group(
            "nccl", timeout=short, device_id=torch.device("cuda", 0)))
        out["hung_init_s"] = time.monotonic() - started
    out["initialized_after_hung_init"] = dist.is_initialized()
    # an operation past the timeout: rank 1's never completes (it stalls), rank 0's waits for
    # it; rank 1's timeout is longer, so that each rank's own deadline is what fails it
    dist.init_process_group("nccl", timeout=timedelta(seconds=2 + 4 * rank), device_id=0)
    out["bound"] = str(dist.group.WORLD.bound_device_id)
    t = d.put(values(rank, N, 1))
    if rank == 1:
        _nccl_ops.group_of(None).comm.stall_next()
    started = time.monotonic()
    work = dist.all_reduce(t, async_op=True)
    wait_for(work.is_completed, timeout=30, what="the stalled all_reduce to fail")
    out["timeout_s"] = time.monotonic() - started
    out["timeout"] = str(work.exception())
    out["timeout_wait"] = _error(work.wait)
    out["after_timeout"] = _error(lambda: dist.all_reduce(d.put(values(rank, N, 2))))
    dist.destroy_process_group()
    # ranks sharing one GPU (the simulator has one) under an NCCL older than 2.30
    with _config.override(NCCL_FAKE="1,version=2.28.9"), warnings.catch_warnings(
            record=True) as caught:
        warnings.simplefilter("always")
        dist.init_process_group("nccl")
        t = d.put(values(rank, N, 3))
        dist.all_reduce(t)
        out["shared/first"] = d.read(t)
        t = d.put(values(rank, N, 4))
        dist.all_reduce(t)
        out["shared/second"] = d.read(t)
        out["shared/said"] = [str(w.message) for w in caught if "share one GPU" in str(w.message)]
        out["shared/paths"] = list(_device_ipc._state.paths.values())
        dist.destroy_process_group()
    return out


def killed(rank: int, ws: int, victim: int) -> dict[str, Any]:
    """``victim`` (a forked child playing the rank) is SIGKILLed once the others have
    started an all_reduce it never joins; theirs must fail naming it, in seconds."""
    rt = _setup()
    d = _Dev(rt)
    if rank == victim:
        pid = os.fork()
        if pid == 0:
            try:
                dist.init_process_group("nccl", timeout=timedelta(seconds=60))
                dist.all_reduce(d.put(values(rank, N, 1)))
                d.read(d.blank(1))
                _get_default_store().wait([f"issued/{r}" for r in range(ws) if r != victim])
                os.kill(os.getpid(), signal.SIGKILL)
            finally:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        return {"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}
    dist.init_process_group("nccl", timeout=timedelta(seconds=60))
    t = d.put(values(rank, N, 1))
    dist.all_reduce(t)
    first = d.read(t)
    work = dist.all_reduce(d.put(values(rank, N, 2)), async_op=True)
    started = time.monotonic()
    _get_default_store().set(f"issued/{rank}", "1")
    wait_for(work.is_completed, timeout=30, what="the all_reduce to fail")
    said = {"first": first, "error": str(work.exception()),
            "seconds": time.monotonic() - started,
            "next": _error(lambda: dist.all_reduce(d.put(values(rank, N, 3))))}
    # no survivor exits before the others have their result (an exited one is "gone" too)
    store = _get_default_store()
    store.set(f"told/{rank}", "1")
    store.wait([f"told/{r}" for r in range(ws) if r != victim])
    return said

"""Rank-side code of tests/integration/test_failures_facade.py: bad input, barriers, DETAIL."""

from __future__ import annotations

import os
import time
import warnings
from datetime import timedelta
from typing import Any

import numpy as np
import torch

import ringtorch.distributed as dist
from ringtorch.collectives.backends.base import Backend as BackendImpl


def _side_store() -> Any:
    """A client of the job's store (rank 0 hosts it), for the test's own signals."""
    from ringtorch.store import TCPStore

    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                    timedelta(seconds=60))


def error_of(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(*args, **kwargs)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


def bad_arguments(rank: int, ws: int) -> dict[str, Any]:
    """Every invalid call raises on the calling rank before anything is sent: afterwards the
    sequence number has not moved and a real collective still works on every rank."""
    dist.init_process_group("gloo")
    pg = dist.group.WORLD
    seq_before = pg._get_sequence_number_for_group()
    t = torch.zeros(2)
    z = [torch.zeros(2) for _ in range(ws)]
    root = rank == 0
    # Cases only one side gets wrong run on that side alone: the other side's call would be
    # valid and would wait for a partner.
    cases = {
        "bcast_src_5": lambda: dist.broadcast(t, src=5),
        "bcast_src_neg": lambda: dist.broadcast(t, src=-1),
        "reduce_dst_7": lambda: dist.reduce(t, dst=7),
        "gather_len": lambda: root and dist.gather(t, [torch.zeros(2)] * (ws + 1)),
        "gather_size": lambda: root and dist.gather(t, [torch.zeros(3)] * ws),
        "gather_list_elsewhere": lambda: rank != 1 and dist.gather(t, z, dst=1),
        "scatter_len": lambda: root and dist.scatter(t, [torch.zeros(2)] * (ws + 1)),
        "scatter_missing": lambda: dist.scatter(t, None, src=rank),
        "scatter_elsewhere": lambda: rank != 1 and dist.scatter(t, z, src=1),
        "scatter_size": lambda: root and dist.scatter(t, [torch.zeros(3)] * ws),
        "ag_len": lambda: dist.all_gather([torch.zeros(2)] * (ws + 1), t),
        "ag_own_size": lambda: dist.all_gather([torch.zeros(3)] * ws, t),
        "ag_dtype": lambda: dist.all_gather([torch.zeros(2, dtype=torch.int32)] * ws, t),
        "ag_tuple": lambda: dist.all_gather(tuple(z), t),
        "agt_size": lambda: dist.all_gather_single(torch.zeros(2 * ws + 1), t),
        "rs_len": lambda: dist.reduce_scatter(t, [torch.zeros(2)] * (ws + 1)),
        "rs_size": lambda: dist.reduce_scatter(torch.zeros(3), z),
        "rst_size": lambda: dist.reduce_scatter_single(t, torch.zeros(2 * ws + 1)),
        "a2a_sum": lambda: dist.all_to_all_single(torch.zeros(4), torch.zeros(4), [1] * ws,
                                                  [3] * ws),
        "a2a_count": lambda: dist.all_to_all_single(torch.zeros(4), torch.zeros(4), [4] * (ws + 1),
                                                    [4] * (ws + 1)),
        "a2a_uneven": lambda: dist.all_to_all_single(torch.zeros(2 * ws + 1),
                                                     torch.zeros(2 * ws + 1)),
        "a2a_strided": lambda: dist.all_to_all_single(torch.zeros(ws, 2).t(),
                                                      torch.zeros(2 * ws)),
        "a2a_list_len": lambda: dist.all_to_all([t] * (ws + 1), [t] * (ws + 1)),
        "a2a_self": lambda: dist.all_to_all_single(
            torch.zeros(2 * ws), torch.zeros(2 * ws), [2] * ws,
            [1 if r == rank else 3 if r == (rank + 1) % ws else 2 for r in range(ws)]),
        "band_float": lambda: dist.all_reduce(t, op=dist.ReduceOp.BAND),
        "max_complex": lambda: dist.all_reduce(torch.zeros(2, dtype=torch.complex64),
                                               op=dist.ReduceOp.MAX),
        "avg_int": lambda: dist.all_reduce(torch.zeros(2, dtype=torch.int64),
                                           op=dist.ReduceOp.AVG),
        "readonly_array": lambda: dist.all_reduce(np.zeros(2)[::-1]),
        "not_a_tensor": lambda: dist.all_reduce([1.0, 2.0]),
        "barrier_timeout_type": lambda: dist.barrier(timeout=5),
        "new_group_range": lambda: dist.new_group([0, ws]),
        "new_group_dup": lambda: dist.new_group([0, 0]),
        "new_group_timeout": lambda: dist.new_group(timeout=5),
        "init_twice": lambda: dist.init_process_group("gloo"),
        "wait_timeout": lambda: dist.irecv(torch.zeros(1), src=rank, tag=77).wait(
            timedelta(milliseconds=200)),
    }
    out = {name: error_of(fn) for name, fn in cases.items()}
    out["seq_unchanged"] = pg._get_sequence_number_for_group() == seq_before
    after = torch.full((3,), float(rank + 1))
    dist.all_reduce(after)
    out["after"] = after.tolist()
    if ws == 4:
        pair = dist.new_group([0, 1])
        if rank in (0, 1):
            out["outside_group"] = error_of(dist.broadcast, t, src=3, group=pair)
    dist.barrier()
    dist.destroy_process_group()
    return out


def monitored(rank: int, ws: int, late: list[int], wait_all: bool) -> dict[str, Any]:
    """Ranks in ``late`` arrive once rank 0's 1 s monitored barrier has given up on them."""
    dist.init_process_group("gloo")
    dist.barrier()
    signals = _side_store()
    if rank in late:
        signals.wait(["rank 0 gave up"])
    start = time.monotonic()
    error = error_of(dist.monitored_barrier, timeout=timedelta(seconds=1),
                   wait_all_ranks=wait_all)
    elapsed = time.monotonic() - start
    if rank == 0:
        signals.set("rank 0 gave up", "1")
        dist.destroy_process_group()  # tells the others, whose release never comes
        return {"error": error, "elapsed": elapsed}
    return {"error": error, "elapsed": elapsed}


def monitored_ok(rank: int, ws: int) -> dict[str, Any]:
    dist.init_process_group("gloo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.monitored_barrier(timeout=5.0)
        dist.monitored_barrier(wait_all_ranks=True)
    dist.barrier()
    dist.destroy_process_group()
    return {"warnings": [str(w.message) for w in caught]}


def detail_mismatch(rank: int, ws: int, case: str) -> dict[str, Any]:
    """RINGTORCH_DEBUG=DETAIL: mismatched collectives raise on every rank before data moves."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=2))
    out: dict[str, Any] = {"level": dist.get_debug_level().name}
    if case == "shape":
        out["error"] = error_of(dist.all_reduce, torch.zeros(2 + rank))
    elif case == "op":
        out["error"] = (error_of(dist.all_reduce, torch.zeros(2)) if rank == 0
                        else error_of(dist.broadcast, torch.zeros(2), src=0))
    elif case == "dtype":
        out["error"] = error_of(dist.all_reduce, torch.zeros(2, dtype=torch.float32 if rank == 0
                                                             else torch.float64))
    elif case == "missing":  # rank 1 leaves only once rank 0's all_reduce has timed out
        signals = _side_store()
        if rank == 0:
            out["error"] = error_of(dist.all_reduce, torch.zeros(2))
            signals.set("rank 0 timed out", "1")
        else:
            out["error"] = None
            signals.wait(["rank 0 timed out"])
    if case != "missing":
        t = torch.ones(2)
        dist.all_reduce(t)
        out["after"] = t.tolist()
    dist.destroy_process_group()
    return out


def no_detail_mismatch(rank: int, ws: int) -> dict[str, Any]:
    """Without DETAIL the backend still refuses mismatched sizes (never computes garbage)."""
    dist.init_process_group("gloo", timeout=timedelta(seconds=5))
    try:
        dist.all_reduce(torch.zeros(2 + rank * 10))
    except dist.DistBackendError as exc:  # the shared-memory path raises a subclass
        return {"error": ("DistBackendError", str(exc))}
    return {"error": None}


class _LoopBackend(BackendImpl):
    """A user backend for a group of one: every collective is a copy."""

    def broadcast(self, buf: Any, root: int, o: Any) -> None:
        pass

    def all_reduce(self, buf: Any, op: Any, o: Any) -> None:
        buf.mul_(10)  # visible proof that this backend ran

    def reduce(self, buf: Any, op: Any, root: int, o: Any) -> None:
        pass

    def all_gather(self, out: Any, inp: Any, o: Any) -> None:
        out.copy_(inp)

    def gather(self, out: Any, inp: Any, root: int, o: Any) -> None:
        out.copy_(inp)

    def scatter(self, out: Any, inp: Any, root: int, o: Any) -> None:
        out.copy_(inp)

    def reduce_scatter(self, out: Any, inp: Any, op: Any, o: Any) -> None:
        out.copy_(inp)

    def all_to_all(self, out: Any, inp: Any, out_splits: Any, in_splits: Any, o: Any) -> None:
        out.copy_(inp)

    def barrier(self, o: Any) -> None:
        pass

    def send(self, buf: Any, dst: int, tag: int, deadline: float) -> None:
        raise RuntimeError("no peers")

    def recv(self, buf: Any, src: Any, tag: int, deadline: float) -> int:
        raise RuntimeError("no peers")

    def abort(self, reason: str) -> None:
        pass

    def close(self) -> None:
        pass


def _make_loop(store: Any, rank: int, size: int, timeout: timedelta) -> BackendImpl:
    from ringtorch.collectives.backends.base import BackendContext

    return _LoopBackend(BackendContext(store, rank, size, timeout, "loop", (rank,)))


def backends(rank: int, ws: int) -> dict[str, Any]:
    """Backend names: unknown, unavailable (nccl), user-registered."""
    out: dict[str, Any] = {
        "unknown": error_of(dist.init_process_group, "nosuch", rank=0, world_size=1,
                          store=dist.HashStore()),
        "nccl": error_of(dist.init_process_group, "nccl", rank=0, world_size=1,
                       store=dist.HashStore()),
        "still_uninitialized": dist.is_initialized(),
        "timeout_type": error_of(dist.init_process_group, "gloo", timeout=30, rank=0,
                               world_size=1, store=dist.HashStore()),
        "available": (dist.is_available(), dist.is_gloo_available(), dist.is_nccl_available(),
                      dist.is_backend_available("gloo"), dist.is_backend_available("nosuch")),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist.Backend.register_backend("loop", _make_loop, devices=["cpu"])
    dist.init_process_group(rank=0, world_size=1, store=dist.HashStore())
    out["no_backend"] = (dist.get_backend(), dist.get_backend_config(),
                         dist.group.WORLD.name(), error_of(dist.monitored_barrier))
    dist.destroy_process_group()
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    out["gloo_config"] = dist.get_backend_config()
    dist.destroy_process_group()
    dist.init_process_group("loop", rank=0, world_size=1, store=dist.HashStore())
    t = torch.ones(2)
    dist.all_reduce(t)
    out["loop"] = (dist.get_backend(), t.tolist(), dist.Backend("LOOP"))
    dist.destroy_process_group()
    return out


def excepthook_and_init_barrier(rank: int, ws: int) -> dict[str, Any]:
    """torch's excepthook prefix, and TORCH_DIST_INIT_BARRIER=1 (a store-based barrier)."""
    import io
    import sys

    before = sys.excepthook
    dist.init_process_group("gloo")
    captured = io.StringIO()
    saved, sys.stderr = sys.stderr, captured
    try:
        try:
            raise KeyError("boom")
        except KeyError:
            sys.excepthook(*sys.exc_info())
    finally:
        sys.stderr = saved
    dist.barrier()
    dist.destroy_process_group()
    return {"report": captured.getvalue(), "restored": sys.excepthook is before}

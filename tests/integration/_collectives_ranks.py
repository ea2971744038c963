"""Rank-side code of the collectives tests: inputs, and every operation run once per case.

The inputs are a pure function of (rank, dtype, size, salt), so the driver (the test module)
rebuilds every rank's inputs and computes the expected results with NumPy itself. The rank
functions here only call ringtorch.distributed and return what they got.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

import ringtorch.distributed as dist
from ringtorch.collectives.reduce_op import make_premul_sum

DTYPES = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "complex64": torch.complex64, "int8": torch.int8,
    "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool,
}
FLOATS = ("float64", "float32", "float16", "bfloat16")
INTS = ("int8", "int32", "int64", "uint8")
N = 6  # elements per rank (and per part of the gathers/scatters)


def make(rank: int, dtype: str, n: int = N, salt: int = 0) -> torch.Tensor:
    """Small integer values (so sums and products are exact in every dtype), per rank."""
    rng = np.random.default_rng(7919 * salt + 104729 * (rank + 1) + sum(map(ord, dtype)))
    if dtype == "bool":
        return torch.from_numpy(rng.integers(0, 2, n).astype(bool))
    if dtype == "uint8":
        return torch.from_numpy(rng.integers(0, 4, n).astype(np.uint8))
    if dtype == "complex64":
        re, im = rng.integers(-3, 4, n), rng.integers(-3, 4, n)
        return torch.from_numpy((re + 1j * im).astype(np.complex64))
    values = rng.integers(-3, 4, n) if dtype in INTS else rng.integers(-4, 5, n).astype(float)
    return torch.from_numpy(np.asarray(values)).to(DTYPES[dtype])


def reduce_ops(dtype: str) -> list[str]:
    """The reductions that have a meaning for ``dtype``."""
    if dtype == "complex64":
        return ["SUM", "AVG"]
    if dtype in FLOATS:
        return ["SUM", "AVG", "PRODUCT", "MIN", "MAX"]
    return ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]


def split_sizes(ws: int, rank: int) -> list[int]:
    """Uneven all_to_all_single split sizes: what ``rank`` sends to each rank."""
    return [(rank + j) % 3 + 1 for j in range(ws)]


def _op(name: str) -> Any:
    return getattr(dist.ReduceOp, name)


def run_all_ops(rank: int, ws: int) -> dict[str, Any]:
    """Every collective, on every dtype, once; returns {case: result}."""
    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    for dtype in DTYPES:
        _reductions(out, rank, ws, dtype)
        _movements(out, rank, ws, dtype)
    _extras(out, rank, ws)
    dist.barrier()
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    out["uses_shm"] = bool(getattr(backend, "uses_shm", False))
    dist.destroy_process_group()
    return out


def _reductions(out: dict[str, Any], rank: int, ws: int, dtype: str) -> None:
    for op in reduce_ops(dtype):
        t = make(rank, dtype, salt=1)
        dist.all_reduce(t, op=_op(op))
        out[f"all_reduce/{op}/{dtype}"] = t
        t = make(rank, dtype, salt=2)
        dist.reduce(t, dst=ws // 2, op=_op(op))
        if rank == ws // 2:
            out[f"reduce/{op}/{dtype}"] = t
    o = torch.zeros(N, dtype=DTYPES[dtype])
    dist.reduce_scatter(o, [make(rank, dtype, salt=10 + j) for j in range(ws)])
    out[f"reduce_scatter/{dtype}"] = o
    o = torch.zeros(N, dtype=DTYPES[dtype])
    inp = torch.cat([make(rank, dtype, salt=10 + j) for j in range(ws)])
    dist.reduce_scatter_single(o, inp)
    out[f"reduce_scatter_single/{dtype}"] = o
    out[f"reduce_scatter_single_input_kept/{dtype}"] = torch.equal(
        inp, torch.cat([make(rank, dtype, salt=10 + j) for j in range(ws)]))


def _movements(out: dict[str, Any], rank: int, ws: int, dtype: str) -> None:
    t = make(rank, dtype, salt=3)
    dist.broadcast(t, src=ws - 1)
    out[f"broadcast/{dtype}"] = t
    parts = [torch.zeros(N, dtype=DTYPES[dtype]) for _ in range(ws)]
    dist.all_gather(parts, make(rank, dtype, salt=4))
    out[f"all_gather/{dtype}"] = parts
    o = torch.zeros(ws * N, dtype=DTYPES[dtype])
    dist.all_gather_single(o, make(rank, dtype, salt=4))
    out[f"all_gather_single/{dtype}"] = o
    o = torch.zeros(ws, N, dtype=DTYPES[dtype])
    dist.all_gather_single(o, make(rank, dtype, salt=4))
    out[f"all_gather_single_stacked/{dtype}"] = o
    gl = [torch.zeros(N, dtype=DTYPES[dtype]) for _ in range(ws)] if rank == 0 else None
    dist.gather(make(rank, dtype, salt=5), gl, dst=0)
    if rank == 0:
        out[f"gather/{dtype}"] = gl
    o = torch.zeros(N, dtype=DTYPES[dtype])
    sl = [make(rank, dtype, salt=20 + j) for j in range(ws)] if rank == ws - 1 else None
    dist.scatter(o, sl, src=ws - 1)
    out[f"scatter/{dtype}"] = o
    outs = [torch.zeros(N, dtype=DTYPES[dtype]) for _ in range(ws)]
    dist.all_to_all(outs, [make(rank, dtype, salt=30 + j) for j in range(ws)])
    out[f"all_to_all/{dtype}"] = outs
    o = torch.zeros(ws * N, dtype=DTYPES[dtype])
    dist.all_to_all_single(o, torch.cat([make(rank, dtype, salt=30 + j) for j in range(ws)]))
    out[f"all_to_all_single/{dtype}"] = o
    sends = split_sizes(ws, rank)
    recvs = [split_sizes(ws, j)[rank] for j in range(ws)]
    o = torch.zeros(sum(recvs), 2, dtype=DTYPES[dtype])
    inp = torch.cat([make(rank, dtype, 2 * s, salt=40 + j).view(s, 2)
                     for j, s in enumerate(sends)])
    dist.all_to_all_single(o, inp, output_split_sizes=recvs, input_split_sizes=sends)
    out[f"all_to_all_single_splits/{dtype}"] = o


def _extras(out: dict[str, Any], rank: int, ws: int) -> None:
    # NumPy arrays in place of tensors; results land in the arrays.
    a = make(rank, "float64", salt=1).numpy().copy()
    dist.all_reduce(a)
    out["numpy/all_reduce"] = a
    a = make(rank, "int32", salt=3).numpy().copy()
    dist.broadcast(a, src=0)
    out["numpy/broadcast"] = a
    parts = [np.zeros(N, dtype=np.float32) for _ in range(ws)]
    dist.all_gather(parts, make(rank, "float32", salt=4).numpy())
    out["numpy/all_gather"] = parts
    # Non-contiguous tensors work where torch's gloo takes them.
    t = make(rank, "float32", 12, salt=50).view(3, 4).t()
    dist.all_reduce(t)
    out["noncontig/all_reduce"] = t.contiguous()
    t = make(rank, "float32", 12, salt=51).view(3, 4).t()
    dist.broadcast(t, src=0)
    out["noncontig/broadcast"] = t.contiguous()
    parts = [torch.zeros(3, 4).t() for _ in range(ws)]
    dist.all_gather(parts, make(rank, "float32", 12, salt=52).view(3, 4).t())
    out["noncontig/all_gather"] = [p.contiguous() for p in parts]
    t = make(rank, "float32", 12, salt=54).view(3, 4).t()
    dist.reduce(t, dst=0)
    if rank == 0:
        out["noncontig/reduce"] = t.contiguous()
    gl = [torch.zeros(3, 4).t() for _ in range(ws)] if rank == 0 else None
    dist.gather(make(rank, "float32", 12, salt=55).view(3, 4).t(), gl, dst=0)
    if rank == 0:
        out["noncontig/gather"] = [g.contiguous() for g in gl]
    o = torch.zeros(3, 4).t()
    dist.scatter(o, [make(j, "float32", 12, salt=56).view(3, 4).t() for j in range(ws)]
                 if rank == 0 else None, src=0)
    out["noncontig/scatter"] = o.contiguous()
    # all_gather with parts of different sizes (torch documents it; gloo refuses it).
    parts = [torch.zeros(r + 1, dtype=torch.int64) for r in range(ws)]
    dist.all_gather(parts, make(rank, "int64", rank + 1, salt=53))
    out["uneven/all_gather"] = parts
    # Coalesced forms and PREMUL_SUM.
    ts = [make(rank, "float32", 3, salt=60), make(rank, "float32", 5, salt=61)]
    dist.all_reduce_coalesced(ts)
    out["all_reduce_coalesced"] = ts
    t = make(rank, "float32", salt=62)
    dist.all_reduce(t, op=make_premul_sum(2.0))
    out["premul_sum"] = t
    # Bitwise identity: non-integer data whose sum depends on the order of additions.
    t = torch.from_numpy(np.random.default_rng(rank).standard_normal(4099).astype(np.float32))
    dist.all_reduce(t)
    out["bits/all_reduce"] = t.numpy().tobytes()
    # Async: issued in order, waited in reverse; a Work completes only after earlier ones.
    ts = [torch.full((2,), float(rank + i)) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    seen = []
    works[-1].wait()
    seen = [w.is_completed() for w in works]
    for w in reversed(works):
        w.wait()
    out["async/values"] = [t.tolist() for t in ts]
    out["async/completed_after_last"] = seen
    out["async/future"] = works[0].get_future().value()[0].tolist()
    w = dist.barrier(async_op=True)
    w.wait()
    out["async/barrier"] = (w.is_completed(), w.is_success(), w.exception(), w.result())
    start = time.monotonic()
    dist.monitored_barrier(timeout=__import__("datetime").timedelta(seconds=20))
    out["monitored_barrier_s"] = time.monotonic() - start
    out["seq"] = dist.group.WORLD._get_sequence_number_for_group()

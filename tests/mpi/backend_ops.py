"""Runs under `mpirun -n N`: every operation of MpiBackend on every dtype, results saved per rank.

Usage: mpirun -n N python tests/mpi/backend_ops.py OUTDIR [THREAD_LEVEL]

Then the same processes run the collectives issue's own rank code
(tests/integration/_collectives_ranks.py) through ringtorch.distributed on the "mpi" backend,
and a few facade scenarios of their own (subgroups, async p2p, object collectives).

Each rank runs the same cases in the same order and pickles, into OUTDIR/rank{R}.pkl, a dict
case name -> {"in": its input as NumPy, "out": its output as NumPy, "error": (type, message),
...}. The rank computes nothing it is checked against: tests/integration/test_mpi_backend.py
reads every rank's inputs and computes the expected outputs itself with NumPy. An unexpected
exception is recorded with its traceback under the case's name; the rank goes on.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
import traceback
import warnings
from datetime import timedelta

if len(sys.argv) > 2:  # the MPI threading level to ask for (before mpi4py.MPI is imported)
    import mpi4py

    mpi4py.rc.thread_level = sys.argv[2]

import numpy as np
import torch

from ringtorch.collectives.backends import mpi_env
from ringtorch.collectives.backends.base import BackendContext
from ringtorch.collectives.backends.mpi import MpiBackend
from ringtorch.collectives.reduce_op import ReduceOp, make_premul_sum

R = ReduceOp
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16,
        torch.uint32, torch.uint64]
COMPLEX = [torch.complex64, torch.complex128, torch.complex32]
OPS_FOR = {
    **{d: [R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, "PREMUL_SUM"] for d in FLOATS},
    **{d: [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR] for d in [*INTS, torch.bool]},
    **{d: [R.SUM, R.AVG, "PREMUL_SUM"] for d in COMPLEX},
}
PREMUL_FACTOR = 2.0
def D() -> float:
    """The deadline of one operation: a minute from now."""
    return time.monotonic() + 60.0

N = 7  # odd on purpose: no chunk of any algorithm comes out even


def make_input(dtype: torch.dtype, rank: int, salt: int, n: int = N) -> torch.Tensor:
    """Small integer-valued data (exact in every dtype, products stay small), per rank."""
    k = torch.arange(n, dtype=torch.int64) * 3 + rank * 5 + salt
    if dtype is torch.bool:
        return (k % 3 == 0)
    if dtype.is_complex:
        return torch.complex((k % 5 - 2).float(), (k % 3).float()).to(dtype)
    if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        return (k % 4).to(dtype)
    return (k % 6 - 2).to(dtype)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype is torch.bfloat16:
        return t.float().numpy()
    if t.dtype is torch.complex32:
        return t.to(torch.complex64).numpy()
    return t.numpy().copy()


class Ranks:
    """The world as this rank sees it: backends, the sequence counters, the result book."""

    def __init__(self, outdir: str) -> None:
        self.outdir = outdir
        self.rank, self.size = mpi_env.world_rank_and_size()
        self.world = self.backend(tuple(range(self.size)), "default")
        self.seq: dict[int, int] = {}
        self.results: dict[str, dict] = {}

    def backend(self, ranks: tuple[int, ...], name: str) -> MpiBackend:
        ctx = BackendContext(store=None, rank=ranks.index(self.rank), size=len(ranks),
                             timeout=timedelta(minutes=1), group_name=name, global_ranks=ranks)
        return MpiBackend(ctx)

    def next_seq(self, backend: MpiBackend) -> int:
        self.seq[id(backend)] = self.seq.get(id(backend), 0) + 1
        return self.seq[id(backend)]

    def record(self, name: str, fn, *args) -> None:
        start = time.monotonic()
        try:
            self.results[name] = fn(*args) or {}
        except Exception as exc:  # recorded for the driver; expected errors are asserted there
            self.results[name] = {"error": (type(exc).__name__, str(exc)),
                                  "traceback": traceback.format_exc()}
        self.results[name]["seconds"] = time.monotonic() - start

    def save(self) -> None:
        path = os.path.join(self.outdir, f"rank{self.rank}.pkl")
        with open(path + ".tmp", "wb") as f:
            pickle.dump(self.results, f)
        os.replace(path + ".tmp", path)


def reduce_op(op: object) -> object:
    return make_premul_sum(PREMUL_FACTOR) if op == "PREMUL_SUM" else op


def op_name(op: object) -> str:
    return op if isinstance(op, str) else op.name  # type: ignore[union-attr]


def all_reduce_cases(w: Ranks) -> None:
    for salt, (dtype, ops) in enumerate(OPS_FOR.items()):
        for op in ops:
            def run(dtype=dtype, op=op, salt=salt):
                buf = make_input(dtype, w.rank, salt)
                inp = to_numpy(buf)
                w.world.all_reduce(buf, reduce_op(op), w.next_seq(w.world), D())
                return {"in": inp, "out": to_numpy(buf)}
            w.record(f"all_reduce/{op_name(op)}/{dtype}", run)

    def random_floats() -> dict:  # not exact: checks closeness and bitwise agreement of ranks
        buf = torch.from_numpy(np.random.default_rng(w.rank).standard_normal(1000, np.float32))
        inp = buf.numpy().copy()
        w.world.all_reduce(buf, R.SUM, w.next_seq(w.world), D())
        return {"in": inp, "out": buf.numpy().copy()}
    w.record("all_reduce/random_float32", random_floats)

    def empty() -> dict:
        buf = torch.empty(0, dtype=torch.float32)
        w.world.all_reduce(buf, R.SUM, w.next_seq(w.world), D())
        w.world.broadcast(buf, 0, w.next_seq(w.world), D())
        return {"out": buf.numel()}
    w.record("empty_tensors", empty)


def rooted_cases(w: Ranks) -> None:
    for root in sorted({0, w.size - 1}):
        for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
            def bcast(root=root, dtype=dtype):
                buf = make_input(dtype, w.rank, 40)
                inp = to_numpy(buf)
                w.world.broadcast(buf, root, w.next_seq(w.world), D())
                return {"in": inp, "out": to_numpy(buf)}
            w.record(f"broadcast/root{root}/{dtype}", bcast)
        for dtype, op in ((torch.float32, R.SUM), (torch.int32, R.MAX), (torch.float64, R.AVG),
                          (torch.bfloat16, R.SUM), (torch.float32, "PREMUL_SUM")):
            def reduce(root=root, dtype=dtype, op=op):
                buf = make_input(dtype, w.rank, 41)
                inp = to_numpy(buf)
                w.world.reduce(buf, reduce_op(op), root, w.next_seq(w.world), D())
                return {"in": inp, "out": to_numpy(buf) if w.rank == root else None}
            w.record(f"reduce/root{root}/{op_name(op)}/{dtype}", reduce)

        def gather(root=root):
            inp = make_input(torch.bfloat16, w.rank, 42)
            out = torch.zeros(w.size * N, dtype=torch.bfloat16) if w.rank == root else None
            w.world.gather(out, inp, root, w.next_seq(w.world), D())
            return {"in": to_numpy(inp), "out": None if out is None else to_numpy(out)}
        w.record(f"gather/root{root}", gather)

        def scatter(root=root):
            inp = make_input(torch.int16, w.rank, 43, n=N * w.size) if w.rank == root else None
            out = torch.zeros(N, dtype=torch.int16)
            w.world.scatter(out, inp, root, w.next_seq(w.world), D())
            return {"in": None if inp is None else to_numpy(inp), "out": to_numpy(out)}
        w.record(f"scatter/root{root}", scatter)


def gather_and_all_to_all_cases(w: Ranks) -> None:
    for dtype in (torch.float32, torch.bool, torch.complex64):
        def all_gather(dtype=dtype):
            inp = make_input(dtype, w.rank, 50)
            out = torch.zeros(w.size * N, dtype=dtype)
            w.world.all_gather(out, inp, w.next_seq(w.world), D())
            return {"in": to_numpy(inp), "out": to_numpy(out)}
        w.record(f"all_gather/{dtype}", all_gather)
    for dtype, op in ((torch.float32, R.SUM), (torch.int64, R.MAX), (torch.float64, R.AVG),
                      (torch.bfloat16, R.SUM), (torch.float32, "PREMUL_SUM")):
        def reduce_scatter(dtype=dtype, op=op):
            inp = make_input(dtype, w.rank, 51, n=N * w.size)
            before = to_numpy(inp)
            out = torch.zeros(N, dtype=dtype)
            w.world.reduce_scatter(out, inp, reduce_op(op), w.next_seq(w.world), D())
            return {"in": before, "out": to_numpy(out), "in_after": to_numpy(inp)}
        w.record(f"reduce_scatter/{op_name(op)}/{dtype}", reduce_scatter)

    def all_to_all() -> dict:
        # rank r sends (r + j) % 3 + 1 elements to rank j, each encoding (r, j, k).
        in_splits = [(w.rank + j) % 3 + 1 for j in range(w.size)]
        out_splits = [(j + w.rank) % 3 + 1 for j in range(w.size)]
        inp = torch.tensor([1000 * w.rank + 10 * j + k for j in range(w.size)
                            for k in range(in_splits[j])], dtype=torch.int64)
        out = torch.full((sum(out_splits),), -1, dtype=torch.int64)
        w.world.all_to_all(out, inp, out_splits, in_splits, w.next_seq(w.world), D())
        return {"in": inp.numpy().copy(), "out": out.numpy().copy(), "splits": in_splits}
    w.record("all_to_all", all_to_all)

    def barrier() -> dict:
        if w.rank == 0:
            time.sleep(0.3)
        entered = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the host
        w.world.barrier(w.next_seq(w.world), D())
        return {"entered": entered, "left": time.monotonic()}
    w.record("barrier", barrier)


def p2p_cases(w: Ranks) -> None:
    if w.size == 1:
        return

    def ring() -> dict:
        # even ranks send first, odd ranks receive first: blocking sends of any size pair up.
        right, left = (w.rank + 1) % w.size, (w.rank - 1) % w.size
        out = make_input(torch.float64, w.rank, 60, n=100_000)  # past every eager limit
        got = torch.zeros_like(out)
        if w.rank % 2 == 0:
            w.world.send(out, right, 7, D())
            sender = w.world.recv(got, left, 7, D())
        else:
            sender = w.world.recv(got, left, 7, D())
            w.world.send(out, right, 7, D())
        return {"in": out.numpy().copy(), "out": got.numpy().copy(), "sender": sender}
    w.record("p2p/ring", ring)

    def tags_match_out_of_order() -> dict:
        if w.rank == 0:
            w.world.send(torch.tensor([5.0]), 1, 5, D())
            w.world.send(torch.tensor([3.0]), 1, 3, D())
            return {}
        if w.rank == 1:
            three, five = torch.zeros(1), torch.zeros(1)
            w.world.recv(three, 0, 3, D())
            w.world.recv(five, 0, 5, D())
            return {"out": np.array([three.item(), five.item()])}
        return {}
    w.record("p2p/tags", tags_match_out_of_order)

    def any_source() -> dict:
        if w.rank != 0:
            w.world.send(torch.tensor([w.rank], dtype=torch.int32), 0, 11, D())
            return {}
        got = []
        for _ in range(w.size - 1):
            buf = torch.zeros(1, dtype=torch.int32)
            sender = w.world.recv(buf, None, 11, D())
            got.append((sender, int(buf.item())))
        return {"out": got}
    w.record("p2p/any_source", any_source)

    def size_mismatch(extra: int) -> dict:
        if w.rank == 1:
            w.world.send(torch.zeros(2 + extra, dtype=torch.int32), 0, 12, D())
        if w.rank == 0:
            w.world.recv(torch.zeros(2, dtype=torch.int32), 1, 12, D())
        return {}
    w.record("p2p/recv_shorter_message", size_mismatch, -1)
    w.record("p2p/recv_longer_message", size_mismatch, 1)
    w.record("p2p/negative_tag", lambda: w.world.send(torch.zeros(1), 1 - w.rank % 2, -1, D()))


def error_cases(w: Ranks) -> None:
    fp8 = torch.zeros(4, dtype=torch.float8_e4m3fn)
    w.record("errors/fp8_sum", lambda: w.world.all_reduce(fp8, R.SUM, 0, D()))
    w.record("errors/band_float", lambda: w.world.all_reduce(torch.zeros(3), R.BAND, 0, D()))
    w.record("errors/max_complex", lambda: w.world.all_reduce(
        torch.zeros(3, dtype=torch.complex64), R.MAX, 0, D()))
    w.record("errors/avg_int", lambda: w.world.all_reduce(
        torch.zeros(3, dtype=torch.int32), R.AVG, 0, D()))
    def ranks_not_mpis() -> None:  # group rank 0 claims to be world rank w.rank + 1
        ctx = BackendContext(store=None, rank=0, size=1, timeout=timedelta(minutes=1),
                             group_name="wrong", global_ranks=(w.rank + 1,))
        MpiBackend(ctx)
    w.record("errors/ranks_not_mpis", ranks_not_mpis)
    if w.size == 1:
        return
    seq = w.next_seq(w.world)
    if w.rank == 0:
        w.record("errors/mismatched_collective", w.world.all_reduce, torch.zeros(3), R.SUM, seq, D())
    else:
        w.record("errors/mismatched_collective", w.world.broadcast, torch.zeros(3), 0, seq, D())
    w.results["errors/mismatched_collective"]["seq"] = seq
    seq = w.next_seq(w.world)
    w.record("errors/mismatched_size", w.world.all_reduce,
             torch.zeros(3 + (w.rank == w.size - 1)), R.SUM, seq, D())
    w.record("errors/after_mismatch_still_works", lambda: {"out": _sum_one(w)})


def _sum_one(w: Ranks) -> float:
    buf = torch.ones(1)
    w.world.all_reduce(buf, R.SUM, w.next_seq(w.world), D())
    return buf.item()


def subgroup_cases(w: Ranks) -> None:
    """Groups of some ranks get their own communicators; two groups run at once on threads."""
    if w.size < 3:
        return
    tail = tuple(range(1, w.size))       # every rank but 0
    ends = (0, w.size - 1)
    groups = {name: w.backend(ranks, name) for name, ranks in (("tail", tail), ("ends", ends))
              if w.rank in ranks}
    for name, backend in groups.items():
        def sub(backend=backend):
            buf = make_input(torch.int64, w.rank, 70)
            inp = buf.numpy().copy()
            backend.all_reduce(buf, R.SUM, w.next_seq(backend), D())
            # group ranks 0 and size-1 swap their global ranks over send/recv
            last, got = backend.size - 1, torch.full((1,), -1, dtype=torch.int64)
            if backend.rank == 0:
                backend.send(torch.tensor([w.rank]), last, 0, D())
                backend.recv(got, last, 0, D())
            elif backend.rank == last:
                backend.recv(got, 0, 0, D())
                backend.send(torch.tensor([w.rank]), 0, 0, D())
            return {"in": inp, "out": buf.numpy().copy(), "peer_global": int(got.item()),
                    "group_rank": backend.rank}
        w.record(f"subgroup/{name}", sub)

    def names_differ() -> dict:  # what use_local_synchronization's hashed names can do
        if w.rank not in ends:
            return {"out": None}
        backend = w.backend(ends, f"ends-as-rank-{w.rank}-calls-it")
        buf = torch.ones(1)
        backend.all_reduce(buf, R.SUM, 1, D())
        backend.close()
        return {"out": buf.item()}
    w.record("subgroup/names_differ", names_differ)
    if mpi_env.thread_level_name() != "MPI_THREAD_MULTIPLE":
        return  # with SERIALIZED, blocking calls of two groups at once can deadlock (as torch)
    threads = {}
    for name, backend in [("world", w.world), *groups.items()]:
        def loop(name=name, backend=backend):
            sums = []
            for _ in range(20):
                buf = torch.ones(1000, dtype=torch.float32)
                backend.all_reduce(buf, R.SUM, w.next_seq(backend), D())
                sums.append(float(buf[0]))
            return {"out": sums, "group_size": backend.size}
        threads[name] = threading.Thread(target=w.record, args=(f"concurrent/{name}", loop))
    for t in threads.values():
        t.start()
    for t in threads.values():
        t.join()


def timeout_cases(w: Ranks) -> None:
    """A receive nobody sends to times out and is cancelled; under MPI_THREAD_SERIALIZED a
    collective that a rank enters too late times out and leaves the backend aborted."""
    if w.size == 1:
        return

    def recv_nobody_sends() -> None:
        if w.rank == 0:
            w.world.recv(torch.zeros(1), 1, 99, time.monotonic() + 0.3)
    w.record("timeout/recv", recv_nobody_sends)
    w.record("timeout/recv_then_barrier", lambda: w.world.barrier(w.next_seq(w.world), D()))
    if mpi_env.thread_level_name() == "MPI_THREAD_MULTIPLE":
        return

    gave_up = os.path.join(w.outdir, "rank0_gave_up")

    def late_barrier() -> None:
        if w.rank == w.size - 1:  # arrives once rank 0's barrier has timed out
            deadline = time.monotonic() + 30
            while not os.path.exists(gave_up) and time.monotonic() < deadline:
                time.sleep(0.01)
        try:
            w.world.barrier(w.next_seq(w.world), time.monotonic() + (0.3 if w.rank == 0 else 1.0))
        finally:
            if w.rank == 0:
                open(gave_up, "w").close()
    w.record("timeout/collective", late_barrier)
    w.record("timeout/after_collective_timeout", lambda: w.world.barrier(w.next_seq(w.world), D()))


class OnMpi:
    """ringtorch.distributed, except that init_process_group always asks for the MPI backend:
    lets the collectives issue's rank code, written for "gloo", run unchanged on MPI. Its one
    gloo-only call, monitored_barrier (torch refuses it on other backends; facade_cases checks
    that refusal), becomes a barrier."""

    def __init__(self, real: object) -> None:
        self._real = real

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def init_process_group(self, backend: object = None, **kwargs: object) -> None:
        self._real.init_process_group("mpi", **kwargs)

    def monitored_barrier(self, group: object = None, timeout: object = None,
                          wait_all_ranks: bool = False) -> None:
        self._real.barrier(group)


def collectives_suite(w: Ranks) -> None:
    def run() -> dict:
        from tests.integration import _collectives_ranks as suite

        real = suite.dist
        suite.dist = OnMpi(real)
        try:
            return {"out": suite.run_all_ops(w.rank, w.size)}
        finally:
            suite.dist = real
    w.record("facade/collectives_suite", run)


def facade_cases(w: Ranks) -> None:
    """init_process_group("mpi") itself, and what the suite above does not cover."""
    import ringtorch.distributed as dist

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.record("facade/init", lambda: dist.init_process_group("mpi", rank=7, world_size=9))
    w.results["facade/init"]["warnings"] = [str(m.message) for m in caught]
    w.record("facade/identity", lambda: {"out": (dist.get_rank(), dist.get_world_size(),
                                                 dist.get_backend(), dist.is_mpi_available())})

    def subgroup() -> dict:
        g = dist.new_group(list(range(w.size - 1, -1, -2)))   # the last rank and every 2nd below
        t = torch.full((2,), float(w.rank + 1))
        if g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.all_reduce(t, group=g)
        return {"out": t.tolist(), "member": g != dist.GroupMember.NON_GROUP_MEMBER}
    w.record("facade/subgroup", subgroup)

    def ring_isend_irecv() -> dict:
        mine = torch.full((300_000,), float(w.rank))          # large: past every eager limit
        got = torch.full((300_000,), -1.0)
        ops = [dist.P2POp(dist.isend, mine, (w.rank + 1) % w.size),
               dist.P2POp(dist.irecv, got, (w.rank - 1) % w.size)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return {"out": (got.min().item(), got.max().item())}
    w.record("facade/ring_isend_irecv", ring_isend_irecv)

    def objects() -> dict:
        gathered = [None] * w.size
        dist.all_gather_object(gathered, {"rank": w.rank, "tag": "x" * w.rank})
        box = [f"from rank 0 of {w.size}"] if w.rank == 0 else [None]
        dist.broadcast_object_list(box, src=0)
        return {"out": (gathered, box[0])}
    w.record("facade/objects", objects)
    w.record("facade/monitored_barrier", dist.monitored_barrier)
    w.record("facade/local_sync_group",
             lambda: dist.new_group(list(range(w.size)), use_local_synchronization=True))
    w.record("facade/destroy", dist.destroy_process_group)


def main() -> None:
    w = Ranks(sys.argv[1])
    w.results["meta"] = {"rank": w.rank, "size": w.size,
                         "thread_level": mpi_env.thread_level_name()}
    for part in (all_reduce_cases, rooted_cases, gather_and_all_to_all_cases, p2p_cases,
                 error_cases, subgroup_cases, timeout_cases):
        part(w)
    w.world.close()
    w.record("errors/after_close", lambda: w.world.barrier(0, D()))
    collectives_suite(w)
    facade_cases(w)
    w.save()


if __name__ == "__main__":
    main()

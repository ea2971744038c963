"""Runs under `mpirun -n N`: what is particular to the MPI backend, results saved per rank.

Usage: mpirun -n N python tests/mpi/backend_ops.py OUTDIR [THREAD_LEVEL]

MpiBackend's own checks (its refusals, messages of the wrong size, mismatched collectives,
groups whose ranks are not MPI's, subgroups and groups running at once on threads, timeouts),
then, through ringtorch.distributed on the "mpi" backend, the backend conformance suite
(``ringtorch.testing.run_backend_cases``: every collective x dtype x reduction against NumPy)
and a few facade scenarios (init_process_group's warning, subgroups, object collectives,
what torch refuses on MPI).

Each rank runs the same cases in the same order and pickles, into OUTDIR/rank{R}.pkl, a dict
case name -> {"out": what it got, "error": (type, message), ...}; the conformance suite's
report is under "facade/conformance". tests/integration/test_mpi_backend.py and
tests/conformance/test_backend.py check them. An unexpected exception is recorded with its
traceback under the case's name; the rank goes on.
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

import torch

from ringtorch._observe.operation import Operation, issued
from ringtorch.collectives.backends import mpi_env
from ringtorch.collectives.backends.base import BackendContext
from ringtorch.collectives.backends.mpi import MpiBackend
from ringtorch.collectives.reduce_op import ReduceOp
from ringtorch.testing import run_backend_cases, wait_for

R = ReduceOp


def D() -> float:
    """The deadline of one operation: a minute from now."""
    return time.monotonic() + 60.0


def op(seq: int, deadline: float | None = None) -> Operation:
    """The operation of one direct backend call: sequence number ``seq``, started now."""
    return issued("test", seq, D() if deadline is None else deadline)

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


def p2p_cases(w: Ranks) -> None:
    if w.size == 1:
        return

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
    w.record("errors/fp8_sum", lambda: w.world.all_reduce(fp8, R.SUM, op(0)))
    w.record("errors/band_float", lambda: w.world.all_reduce(torch.zeros(3), R.BAND, op(0)))
    w.record("errors/max_complex", lambda: w.world.all_reduce(
        torch.zeros(3, dtype=torch.complex64), R.MAX, op(0)))
    w.record("errors/avg_int", lambda: w.world.all_reduce(
        torch.zeros(3, dtype=torch.int32), R.AVG, op(0)))
    def ranks_not_mpis() -> None:  # group rank 0 claims to be world rank w.rank + 1
        ctx = BackendContext(store=None, rank=0, size=1, timeout=timedelta(minutes=1),
                             group_name="wrong", global_ranks=(w.rank + 1,))
        MpiBackend(ctx)
    w.record("errors/ranks_not_mpis", ranks_not_mpis)
    if w.size == 1:
        return
    seq = w.next_seq(w.world)
    if w.rank == 0:
        w.record("errors/mismatched_collective", w.world.all_reduce, torch.zeros(3), R.SUM, op(seq))
    else:
        w.record("errors/mismatched_collective", w.world.broadcast, torch.zeros(3), 0, op(seq))
    w.results["errors/mismatched_collective"]["seq"] = seq
    seq = w.next_seq(w.world)
    w.record("errors/mismatched_size", w.world.all_reduce,
             torch.zeros(3 + (w.rank == w.size - 1)), R.SUM, op(seq))
    w.record("errors/after_mismatch_still_works", lambda: {"out": _sum_one(w)})


def _sum_one(w: Ranks) -> float:
    buf = torch.ones(1)
    w.world.all_reduce(buf, R.SUM, op(w.next_seq(w.world)))
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
            buf = torch.arange(7, dtype=torch.int64) * (w.rank + 1)
            inp = buf.numpy().copy()
            backend.all_reduce(buf, R.SUM, op(w.next_seq(backend)))
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
        backend.all_reduce(buf, R.SUM, op(1))
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
                backend.all_reduce(buf, R.SUM, op(w.next_seq(backend)))
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
    w.record("timeout/recv_then_barrier", lambda: w.world.barrier(op(w.next_seq(w.world))))
    if mpi_env.thread_level_name() == "MPI_THREAD_MULTIPLE":
        return

    gave_up = os.path.join(w.outdir, "rank0_gave_up")

    def late_barrier() -> None:
        if w.rank == w.size - 1:  # arrives once rank 0's barrier has timed out
            wait_for(lambda: os.path.exists(gave_up), 30, "rank 0's barrier to time out")
        try:
            w.world.barrier(op(w.next_seq(w.world),
                               time.monotonic() + (0.3 if w.rank == 0 else 1.0)))
        finally:
            if w.rank == 0:
                open(gave_up, "w").close()
    w.record("timeout/collective", late_barrier)
    w.record("timeout/after_collective_timeout", lambda: w.world.barrier(op(w.next_seq(w.world))))


def facade_cases(w: Ranks) -> None:
    """init_process_group("mpi") itself, the conformance suite, and what it does not cover."""
    import ringtorch.distributed as dist

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        w.record("facade/init", lambda: dist.init_process_group("mpi", rank=7, world_size=9))
    w.results["facade/init"]["warnings"] = [str(m.message) for m in caught]
    w.record("facade/identity", lambda: {"out": (dist.get_rank(), dist.get_world_size(),
                                                 dist.get_backend(), dist.is_mpi_available())})
    w.record("facade/conformance", lambda: {"report": run_backend_cases(w.outdir)})

    def subgroup() -> dict:
        g = dist.new_group(list(range(w.size - 1, -1, -2)))   # the last rank and every 2nd below
        t = torch.full((2,), float(w.rank + 1))
        if g != dist.GroupMember.NON_GROUP_MEMBER:
            dist.all_reduce(t, group=g)
        return {"out": t.tolist(), "member": g != dist.GroupMember.NON_GROUP_MEMBER}
    w.record("facade/subgroup", subgroup)

    def flight_record() -> dict:
        from ringtorch.distributed import flight_recorder

        dist.all_reduce(torch.ones(6, dtype=torch.float64))
        last = flight_recorder.dump()["entries"][-1]
        return {"out": {k: last.get(k) for k in ("op", "state", "call", "transport",
                                                  "algorithm")}}
    w.record("facade/flight_record", flight_record)

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
    # torch's shrink_group works on NCCL only; ringtorch's on its native backend: MPI refuses
    w.record("facade/shrink_group", lambda: dist.shrink_group([w.size - 1]))
    w.record("facade/destroy", dist.destroy_process_group)


def main() -> None:
    w = Ranks(sys.argv[1])
    w.results["meta"] = {"rank": w.rank, "size": w.size,
                         "thread_level": mpi_env.thread_level_name()}
    for part in (p2p_cases, error_cases, subgroup_cases, timeout_cases):
        part(w)
    w.world.close()
    w.record("errors/after_close", lambda: w.world.barrier(op(0)))
    facade_cases(w)
    w.save()


if __name__ == "__main__":
    main()

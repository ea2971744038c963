"""The rank side of the backend conformance suite: every collective, run once per case.

Each rank of an initialised default group runs the same cases in the same order, through the
public ``ringtorch.distributed`` functions (so the ProcessGroup above the backend is exercised
as users reach it), and checks each result against ``_oracle`` (NumPy). A case that fails is
recorded with its name, the world size and the rank, and the run goes on: one run reports
every failing case. What a rank cannot check alone (that every rank computed the same bits)
it reports as digests, which the driver compares across ranks.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

import ringtorch.distributed as dist
from ringtorch.testing import _oracle as o
from ringtorch.testing._case_base import LARGE, CaseReport, N
from ringtorch.testing._collective_cases import CollectiveCases

__all__ = ["CaseReport", "run_backend_cases"]


class _Cases(CollectiveCases):
    """Point to point beyond the ring, the async forms, barriers and sizes."""

    # -- point to point beyond the ring ----------------------------------------------------

    def point_to_point(self) -> None:
        if self.ws == 1:
            return
        self.run("send_recv/large_float64", lambda: self._send_recv(
            "send_recv/large_float64", torch.float64, LARGE))
        self.run("isend_irecv/tags_out_of_order", self._tags)
        self.run("recv/any_source", self._any_source)
        self.run("isend_irecv/ring", lambda: self._async_ring("isend_irecv/ring", batch=False))
        self.run("batch_isend_irecv/ring", lambda: self._async_ring("batch_isend_irecv/ring",
                                                                    batch=True))

    def _tags(self) -> None:
        """Messages are matched by tag, not by arrival: rank 1 asks for tag 3 first."""
        case = "isend_irecv/tags_out_of_order"
        if self.rank == 0:
            works = [dist.isend(torch.tensor([5.0]), dst=1, tag=5),
                     dist.isend(torch.tensor([3.0]), dst=1, tag=3)]
            for work in works:
                work.wait()
        elif self.rank == 1:
            three, five = torch.zeros(1), torch.zeros(1)
            dist.recv(three, src=0, tag=3)
            dist.recv(five, src=0, tag=5)
            if (three.item(), five.item()) != (3.0, 5.0):
                self.fail(case, f"tag 3 got {three.item()}, tag 5 got {five.item()}")

    def _any_source(self) -> None:
        case = "recv/any_source"
        if self.rank != 0:
            dist.send(torch.tensor([self.rank], dtype=torch.int64), dst=0, tag=11)
            return
        seen = set()
        for _ in range(self.ws - 1):
            buf = torch.zeros(1, dtype=torch.int64)
            sender = dist.recv(buf, tag=11)
            if sender != buf.item():
                self.fail(case, f"recv returned sender {sender} for rank {buf.item()}'s message")
            seen.add(sender)
        if seen != set(range(1, self.ws)):
            self.fail(case, f"received from {sorted(seen)}, expected every other rank")

    def _async_ring(self, case: str, batch: bool) -> None:
        right, left = (self.rank + 1) % self.ws, (self.rank - 1) % self.ws
        got = torch.zeros(N, dtype=torch.int32)
        mine = self.mine(case, torch.int32)
        if batch:
            works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, left),
                                            dist.P2POp(dist.isend, mine, right)])
        else:
            works = [dist.irecv(got, src=left), dist.isend(mine, dst=right)]
        for work in works:
            work.wait()
        self.check(case, got, o.make_input(case, left, torch.int32, N), torch.int32)

    # -- async Work, barrier, sizes --------------------------------------------------------

    def async_forms(self) -> None:
        f32 = torch.float32
        for name, body in (("all_reduce", self._async_all_reduce),
                           ("broadcast", self._async_broadcast),
                           ("all_gather", self._async_all_gather),
                           ("reduce_scatter_single", self._async_reduce_scatter),
                           ("all_to_all_single", self._async_all_to_all),
                           ("reduce", self._async_reduce), ("gather", self._async_gather),
                           ("scatter", self._async_scatter),
                           ("in_order", self._async_in_order)):
            case = f"async/{name}"
            self.run(case, lambda c=case, b=body: b(c, f32))

    def _wait(self, case: str, work: Any) -> None:
        if work is None:
            self.fail(case, "async_op=True returned None instead of a Work")
            return
        work.wait()
        if not work.is_completed() or not work.is_success():
            self.fail(case, "wait() returned but the Work is not completed successfully")

    def _async_all_reduce(self, case: str, dtype: torch.dtype) -> None:
        t = self.mine(case, dtype)
        work = dist.all_reduce(t, async_op=True)
        self._wait(case, work)
        expected = o.reduce(self.inputs(case, dtype), "SUM", dtype)
        self.check(case, t, expected, dtype)
        self.check(f"{case} future", work.get_future().value()[0], expected, dtype)

    def _async_broadcast(self, case: str, dtype: torch.dtype) -> None:
        t, src = self.mine(case, dtype), self.root(case)
        self._wait(case, dist.broadcast(t, src=src, async_op=True))
        self.check(case, t, self.inputs(case, dtype)[src], dtype)

    def _async_all_gather(self, case: str, dtype: torch.dtype) -> None:
        parts = [torch.zeros(N, dtype=dtype) for _ in range(self.ws)]
        self._wait(case, dist.all_gather(parts, self.mine(case, dtype), async_op=True))
        self.check(case, torch.cat(parts), np.concatenate(self.inputs(case, dtype)), dtype)

    def _async_reduce_scatter(self, case: str, dtype: torch.dtype) -> None:
        out = torch.zeros(N, dtype=dtype)
        work = dist.reduce_scatter_single(out, self.mine(case, dtype, N * self.ws),
                                          async_op=True)
        self._wait(case, work)
        full = o.reduce(self.inputs(case, dtype, N * self.ws), "SUM", dtype)
        self.check(case, out, full[self.rank * N:(self.rank + 1) * N], dtype)

    def _async_all_to_all(self, case: str, dtype: torch.dtype) -> None:
        out = torch.zeros(self.ws * N, dtype=dtype)
        work = dist.all_to_all_single(out, self.mine(case, dtype, self.ws * N), async_op=True)
        self._wait(case, work)
        expected = [o.make_input(case, j, dtype, self.ws * N)[self.rank * N:(self.rank + 1) * N]
                    for j in range(self.ws)]
        self.check(case, out, np.concatenate(expected), dtype)

    def _async_reduce(self, case: str, dtype: torch.dtype) -> None:
        t, root = self.mine(case, dtype), self.root(case)
        self._wait(case, dist.reduce(t, dst=root, async_op=True))
        if self.rank == root:
            self.check(case, t, o.reduce(self.inputs(case, dtype), "SUM", dtype), dtype)

    def _async_gather(self, case: str, dtype: torch.dtype) -> None:
        dst = self.root(case)
        parts = [torch.zeros(N, dtype=dtype) for _ in range(self.ws)] if self.rank == dst else None
        self._wait(case, dist.gather(self.mine(case, dtype), parts, dst=dst, async_op=True))
        if parts is not None:
            self.check(case, torch.cat(parts), np.concatenate(self.inputs(case, dtype)), dtype)

    def _async_scatter(self, case: str, dtype: torch.dtype) -> None:
        src = self.root(case)
        full = self.mine(case, dtype, self.ws * N) if self.rank == src else None
        out = torch.zeros(N, dtype=dtype)
        self._wait(case, dist.scatter(out, None if full is None else list(full.split(N)),
                                      src=src, async_op=True))
        mine = o.make_input(case, src, dtype, self.ws * N)[self.rank * N:(self.rank + 1) * N]
        self.check(case, out, mine, dtype)

    def _async_in_order(self, case: str, dtype: torch.dtype) -> None:
        """Works complete in the order they were issued: once the last is done, all are."""
        ts = [self.mine(f"{case}/{i}", dtype) for i in range(8)]
        works = [dist.all_reduce(t, async_op=True) for t in ts]
        works[-1].wait()
        early = [i for i, w in enumerate(works) if not w.is_completed()]
        if early:
            self.fail(case, f"works {early} were not completed when the last one was")
        for i, (t, work) in enumerate(zip(ts, works, strict=True)):
            work.wait()
            self.check(f"{case} #{i}", t, o.reduce(self.inputs(f"{case}/{i}", dtype), "SUM",
                                                   dtype), dtype)

    def barriers(self) -> None:
        for k in range(3):
            self.run(f"barrier/{k}", lambda k=k: self._barrier(k, async_op=k == 2))

    def _barrier(self, k: int, async_op: bool) -> None:
        """No rank leaves a barrier before every rank has entered it (marker files)."""
        case = f"barrier/{k}"
        with open(os.path.join(self.marker_dir, f"barrier{k}-rank{self.rank}"), "w"):
            pass
        work = dist.barrier(async_op=async_op)
        if async_op:
            self._wait(case, work)
        missing = [r for r in range(self.ws) if not os.path.exists(
            os.path.join(self.marker_dir, f"barrier{k}-rank{r}"))]
        if missing:
            self.fail(case, f"left the barrier before ranks {missing} entered it")

    def sizes(self) -> None:
        """Empty tensors, 1 to 5 elements (fewer than ranks: empty chunks), large ones, the
        in-place forms, and random floats whose sum depends on the order."""
        for numel in (1, 2, 5):
            for op, body in (("all_reduce", lambda c, n: self._all_reduce(
                                 c, torch.int16, "SUM", dist.ReduceOp.SUM, n)),
                             ("broadcast", lambda c, n: self._broadcast(c, torch.int16, n)),
                             ("all_gather_single", lambda c, n: self._all_gather_single(
                                 c, torch.int16, n))):
                case = f"small/{op}/{numel}"
                self.run(case, lambda c=case, b=body, n=numel: b(c, n))
        for dtype in (torch.float32, torch.uint8):
            case = f"in_place/all_gather_single/{o.dtype_name(dtype)}"
            self.run(case, lambda c=case, d=dtype: self._all_gather_in_place(c, d))
            case = f"in_place/reduce_scatter_single/{o.dtype_name(dtype)}"
            self.run(case, lambda c=case, d=dtype: self._reduce_scatter_in_place(c, d))
        for dtype in (torch.float32, torch.int64):
            name = o.dtype_name(dtype)
            self.run(f"empty/{name}", lambda d=dtype: self._empty(d))
            case = f"large/all_reduce/{name}"
            self.run(case, lambda c=case, d=dtype: self._all_reduce(c, d, "SUM", dist.ReduceOp.SUM,
                                                                   LARGE))
            case = f"large/broadcast/{name}"
            self.run(case, lambda c=case, d=dtype: self._broadcast(c, d, LARGE))
            case = f"large/all_gather_single/{name}"
            self.run(case, lambda c=case, d=dtype: self._all_gather_single(c, d, LARGE // 4))
        self.run("bits/all_reduce", self._random_floats)

    def _all_gather_in_place(self, case: str, dtype: torch.dtype) -> None:
        """The input is this rank's block of the output (FSDP gathers its shards so)."""
        out = torch.zeros(self.ws * N, dtype=dtype)
        block = out[self.rank * N:(self.rank + 1) * N]
        block.copy_(self.mine(case, dtype))
        dist.all_gather_single(out, block)
        self.check(case, out, np.concatenate(self.inputs(case, dtype)), dtype)

    def _reduce_scatter_in_place(self, case: str, dtype: torch.dtype) -> None:
        """The output is this rank's block of the input."""
        inp = self.mine(case, dtype, self.ws * N)
        out = inp[self.rank * N:(self.rank + 1) * N]
        dist.reduce_scatter_single(out, inp)
        full = o.reduce(self.inputs(case, dtype, self.ws * N), "SUM", dtype)
        self.check(case, out, full[self.rank * N:(self.rank + 1) * N], dtype)

    def _empty(self, dtype: torch.dtype) -> None:
        t = torch.zeros(0, dtype=dtype)
        dist.all_reduce(t)
        dist.broadcast(t, src=0)
        out = torch.zeros(0, dtype=dtype)
        dist.all_gather_single(out, t)
        if t.numel() or out.numel():
            self.fail(f"empty/{o.dtype_name(dtype)}", "an empty tensor came back non-empty")

    def _random_floats(self) -> None:
        case = "bits/all_reduce"
        data = [np.random.default_rng([4099, r]).standard_normal(4099).astype(np.float32)
                for r in range(self.ws)]
        t = torch.from_numpy(data[self.rank].copy())
        dist.all_reduce(t)
        expected = np.sum(np.stack(data).astype(np.float64), axis=0)
        if not np.allclose(t.numpy(), expected, rtol=1e-5, atol=1e-5):
            self.fail(case, "the sum of random float32 data is off by more than rounding")
        self.digest(case, t)


def run_backend_cases(marker_dir: str) -> CaseReport:
    """Run every case on the default group (already initialised) and report this rank's view.

    ``marker_dir`` is a directory every rank can write (the barrier cases leave files there).
    Every rank of the group must call this at the same time; see ``check_backend``.
    """
    cases = _Cases(marker_dir)
    for part in (cases.reductions, cases.movements, cases.point_to_point, cases.async_forms,
                 cases.barriers, cases.sizes):
        part()
    return cases.report

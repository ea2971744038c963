"""The conformance suite's collectives: every reduction form x dtype x reduction, and every
data-movement collective x dtype, each checked against the NumPy oracle."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import ringtorch.distributed as dist
from ringtorch.collectives.reduce_op import make_premul_sum
from ringtorch.testing import _oracle as o
from ringtorch.testing._case_base import CaseBase, N


class CollectiveCases(CaseBase):
    """Reductions and data movement (see the module docstring)."""

    # -- reductions ----------------------------------------------------------------------

    def reductions(self) -> None:
        forms = (("all_reduce", self._all_reduce), ("reduce", self._reduce),
                 ("reduce_scatter", self._reduce_scatter_list),
                 ("reduce_scatter_single", self._reduce_scatter_single))
        for dtype in (*o.DTYPES, *o.NO_REDUCTION):
            for reduction in o.REDUCTIONS:
                op = (make_premul_sum(o.PREMUL_FACTOR) if reduction == "PREMUL_SUM"
                      else getattr(dist.ReduceOp, reduction))
                refusal = o.refusal(reduction, dtype)
                for form, body in forms:
                    case = f"{form}/{reduction}/{o.dtype_name(dtype)}"
                    if refusal is None:
                        self.run(case, lambda c=case, b=body, d=dtype, r=reduction, p=op:
                                 b(c, d, r, p))
                    else:
                        self.run(case, lambda c=case, b=body, d=dtype, r=reduction, p=op,
                                 f=refusal: self._refused(c, f, lambda: b(c, d, r, p)))

    def _refused(self, case: str, refusal: o.Refusal, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as exc:
            if not isinstance(exc, refusal.exc_type):
                self.fail(case, f"must raise {refusal.exc_type.__name__}, raised "
                                f"{type(exc).__name__}: {exc}")
            elif not any(name in str(exc) for name in refusal.names):
                self.fail(case, f"the error must name one of {list(refusal.names)}: {exc}")
            return
        self.fail(case, f"must raise {refusal.exc_type.__name__} (torch refuses it), returned")

    def _all_reduce(self, case: str, dtype: torch.dtype, reduction: str, op: Any,
                    numel: int = N) -> None:
        t = self.mine(case, dtype, numel)
        dist.all_reduce(t, op=op)
        self.check(case, t, o.reduce(self.inputs(case, dtype, numel), reduction, dtype), dtype,
                   reduction)
        self.digest(case, t)

    def _reduce(self, case: str, dtype: torch.dtype, reduction: str, op: Any) -> None:
        t, root = self.mine(case, dtype), self.root(case)
        dist.reduce(t, dst=root, op=op)
        if self.rank == root:
            self.check(case, t, o.reduce(self.inputs(case, dtype), reduction, dtype), dtype,
                       reduction)

    def _reduce_scatter_list(self, case: str, dtype: torch.dtype, reduction: str,
                             op: Any) -> None:
        parts = [self.mine(f"{case}/{j}", dtype) for j in range(self.ws)]
        kept = [p.clone() for p in parts]
        out = torch.zeros(N, dtype=dtype)
        dist.reduce_scatter(out, parts, op=op)
        mine = self.inputs(f"{case}/{self.rank}", dtype)
        self.check(case, out, o.reduce(mine, reduction, dtype), dtype, reduction)
        if not all(torch.equal(a, b) for a, b in zip(parts, kept, strict=True)):
            self.fail(case, "the input list was modified")

    def _reduce_scatter_single(self, case: str, dtype: torch.dtype, reduction: str,
                               op: Any) -> None:
        inp = self.mine(case, dtype, N * self.ws)
        kept = inp.clone()
        out = torch.zeros(N, dtype=dtype)
        dist.reduce_scatter_single(out, inp, op=op)
        full = o.reduce(self.inputs(case, dtype, N * self.ws), reduction, dtype)
        self.check(case, out, full[self.rank * N:(self.rank + 1) * N], dtype, reduction)
        if not torch.equal(inp, kept):
            self.fail(case, "the input tensor was modified")

    # -- data movement -------------------------------------------------------------------

    def movements(self) -> None:
        for dtype in (*o.DTYPES, *o.NO_REDUCTION):
            name = o.dtype_name(dtype)
            for form, body in (("broadcast", self._broadcast), ("all_gather", self._all_gather),
                               ("all_gather_single", self._all_gather_single),
                               ("all_gather_uneven", self._all_gather_uneven),
                               ("gather", self._gather), ("scatter", self._scatter),
                               ("all_to_all", self._all_to_all),
                               ("all_to_all_single", self._all_to_all_single),
                               ("all_to_all_single_uneven", self._all_to_all_uneven),
                               ("send_recv", self._send_recv)):
                case = f"{form}/{name}"
                self.run(case, lambda c=case, b=body, d=dtype: b(c, d))

    def _broadcast(self, case: str, dtype: torch.dtype, numel: int = N) -> None:
        t, src = self.mine(case, dtype, numel), self.root(case)
        dist.broadcast(t, src=src)
        self.check(case, t, self.inputs(case, dtype, numel)[src], dtype)

    def _all_gather(self, case: str, dtype: torch.dtype) -> None:
        parts = [torch.zeros(N, dtype=dtype) for _ in range(self.ws)]
        dist.all_gather(parts, self.mine(case, dtype))
        for r, (got, want) in enumerate(zip(parts, self.inputs(case, dtype), strict=True)):
            self.check(f"{case} part {r}", got, want, dtype)

    def _all_gather_single(self, case: str, dtype: torch.dtype, numel: int = N) -> None:
        flat = torch.zeros(self.ws * numel, dtype=dtype)
        dist.all_gather_single(flat, self.mine(case, dtype, numel))
        self.check(case, flat, np.concatenate(self.inputs(case, dtype, numel)), dtype)
        stacked = torch.zeros(self.ws, numel, dtype=dtype)
        dist.all_gather_single(stacked, self.mine(case, dtype, numel))
        self.check(f"{case} stacked", stacked, np.stack(self.inputs(case, dtype, numel)), dtype)

    def _all_gather_uneven(self, case: str, dtype: torch.dtype) -> None:
        parts = [torch.zeros(r + 1, dtype=dtype) for r in range(self.ws)]
        dist.all_gather(parts, self.mine(case, dtype, self.rank + 1))
        for r, got in enumerate(parts):
            self.check(f"{case} part {r}", got, o.make_input(case, r, dtype, r + 1), dtype)

    def _gather(self, case: str, dtype: torch.dtype) -> None:
        dst = self.root(case)
        parts = [torch.zeros(N, dtype=dtype) for _ in range(self.ws)] if self.rank == dst else None
        dist.gather(self.mine(case, dtype), parts, dst=dst)
        for r, got in enumerate(parts or []):
            self.check(f"{case} part {r}", got, o.make_input(case, r, dtype, N), dtype)

    def _scatter(self, case: str, dtype: torch.dtype) -> None:
        src = self.root(case)
        parts = ([self.mine(f"{case}/{j}", dtype) for j in range(self.ws)]
                 if self.rank == src else None)
        out = torch.zeros(N, dtype=dtype)
        dist.scatter(out, parts, src=src)
        self.check(case, out, o.make_input(f"{case}/{self.rank}", src, dtype, N), dtype)

    def _all_to_all(self, case: str, dtype: torch.dtype) -> None:
        outs = [torch.zeros(N, dtype=dtype) for _ in range(self.ws)]
        dist.all_to_all(outs, [self.mine(f"{case}/{j}", dtype) for j in range(self.ws)])
        for j, got in enumerate(outs):
            self.check(f"{case} from {j}", got,
                       o.make_input(f"{case}/{self.rank}", j, dtype, N), dtype)

    def _all_to_all_single(self, case: str, dtype: torch.dtype) -> None:
        out = torch.zeros(self.ws * N, dtype=dtype)
        dist.all_to_all_single(out, self.mine(case, dtype, self.ws * N))
        expected = [o.make_input(case, j, dtype, self.ws * N)[self.rank * N:(self.rank + 1) * N]
                    for j in range(self.ws)]
        self.check(case, out, np.concatenate(expected), dtype)

    def _all_to_all_uneven(self, case: str, dtype: torch.dtype) -> None:
        # rank r sends (r + 2j) % 3 rows of 2 to rank j: some parts are empty
        def splits(r: int) -> list[int]:
            return [(r + 2 * j) % 3 for j in range(self.ws)]

        def rows(r: int) -> np.ndarray:
            return o.make_input(case, r, dtype, 2 * sum(splits(r))).reshape(-1, 2)

        recv = [splits(j)[self.rank] for j in range(self.ws)]
        out = torch.zeros(sum(recv), 2, dtype=dtype)
        inp = o.to_tensor(rows(self.rank), dtype)
        dist.all_to_all_single(out, inp, output_split_sizes=recv,
                               input_split_sizes=splits(self.rank))
        expected = [rows(j)[sum(splits(j)[:self.rank]):][:recv[j]] for j in range(self.ws)]
        self.check(case, out, np.concatenate(expected).reshape(-1, 2), dtype)

    def _send_recv(self, case: str, dtype: torch.dtype, numel: int = N) -> None:
        if self.ws == 1:
            return
        # around the ring; even ranks send first, odd ranks receive first
        right, left = (self.rank + 1) % self.ws, (self.rank - 1) % self.ws
        got = torch.zeros(numel, dtype=dtype)
        if self.rank % 2 == 0:
            dist.send(self.mine(case, dtype, numel), dst=right)
            sender = dist.recv(got, src=left)
        else:
            sender = dist.recv(got, src=left)
            dist.send(self.mine(case, dtype, numel), dst=right)
        if sender != left:
            self.fail(case, f"recv returned sender {sender}, expected {left}")
        self.check(case, got, o.make_input(case, left, dtype, numel), dtype)

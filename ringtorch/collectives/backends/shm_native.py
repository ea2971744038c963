"""The native backend with a shared-memory fast path for groups whose ranks share one host.

When every rank of the group is on this host (same host identity: hostname + boot id, or
RINGTORCH_HOST_ID), has RINGTORCH_SHM on and could create its segment, the group's
all_reduce, reduce_scatter, all_gather, broadcast, reduce, gather, scatter and barrier run
through shared memory (algorithms/shm_*.py) instead of sockets; every rank takes the same
decision at construction (through the group's store), so no rank runs shared memory while a
peer runs sockets. all_to_all (whose splits differ per rank) and send/recv use the socket
path of NativeBackend unchanged. A group spanning hosts uses shared memory within each host and
sockets between hosts (shm_hierarchy.py) when some host has two or more of its ranks.

Failure handling is NativeBackend's: a shared-memory wait that finds a peer dead (its segment
lock released), aborted, in another collective or past the deadline aborts the backend
(ABORT frames to the peers), and every later call raises with that cause. A peer's death seen
first on the sockets (EOF on a reader thread) also ends a shared-memory wait, within a
millisecond or so. Socket collectives publish their descriptor in the segment too, so a rank
waiting in shared memory for a peer stuck in, say, an all_to_all says so at once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch

from ringtorch import _config
from ringtorch._wire.mesh import COLL_HEADER, COLL_TAG, NO_REDOP, NO_ROOT, host_identity
from ringtorch._wire.shm_domain import Desc
from ringtorch._wire.shm_setup import open_domain
from ringtorch.collectives.algorithms import shm_copy, shm_reduce
from ringtorch.collectives.algorithms.shm_shared import SharedBuffers
from ringtorch.collectives.algorithms.shm_space import ShmSpace
from ringtorch.collectives.backends.base import BackendContext
from ringtorch.collectives.backends.native import NativeBackend
from ringtorch.collectives.backends.native_status import (
    DTYPE_CODES,
    OP_CODES,
    check_rooted,
    check_sizes,
    describe_header,
)
from ringtorch.collectives.reduce_op import (
    RedOpType,
    as_bytes,
    finish_avg,
    premul_factor,
)

log = logging.getLogger(__name__)


_NUMPY_NATIVE = {torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8,
                 torch.uint8, torch.bool, torch.complex64, torch.complex128, torch.float16}


# dtypes whose AVG division the staged all_reduce applies slice by slice, with NumPy: the
# same IEEE division as finish_avg's div_ (bit for bit), without torch's intra-op threads,
# which a collective's waits would have to share the cores with
_DIVIDED_IN_PLACE = {torch.float32: np.float32, torch.float64: np.float64,
                     torch.float16: np.float16}


def _bytes(tensor: torch.Tensor) -> Any:
    """The bytes of a flat contiguous tensor as a uint8 array (reduce_op.as_bytes, faster for
    the dtypes NumPy has: a collective's fixed cost is a few microseconds)."""
    if tensor.dtype in _NUMPY_NATIVE:
        return tensor.numpy().view(np.uint8)
    return as_bytes(tensor)


# Descriptors of the shared-tensor allocations (not socket collectives): their own kind, and
# sequence numbers far from any collective's, so that a late peer's collective with the same
# number is never taken for a mismatch. A shared buffer's all_reduce sets SHARED_BIT + index.
SHARED_TENSOR_KIND = 64
SHARED_SEQ_BASE = 1 << 62
SHARED_SHIFT = 40


def describe(desc: Desc) -> str:
    """A descriptor in the socket path's words: 'broadcast #3 (float32, 4096 bytes, root 1)'."""
    dtype, redop = desc.detail & 0xFF, (desc.detail >> 8) & 0xFF
    root, shared = (desc.detail >> 16) & 0xFFFFFF, desc.detail >> SHARED_SHIFT
    if desc.kind == SHARED_TENSOR_KIND:
        header = COLL_HEADER.pack(COLL_TAG, 0, dtype, NO_REDOP, NO_ROOT, 0, desc.nbytes, 0)
        words = describe_header(header).split("(", 1)[1]
        return f"shared_tensor #{desc.seq - SHARED_SEQ_BASE} ({words}"
    header = COLL_HEADER.pack(COLL_TAG, desc.kind & 0xFF, dtype, redop,
                              NO_ROOT if root == 0 else root - 1, desc.seq, desc.nbytes, 0)
    text = describe_header(header)
    return text if not shared else f"{text[:-1]}, shared tensor #{shared - 1})"


def make_desc(op: str, seq: int, dtype: torch.dtype, redop: int, root: int, nbytes: int) -> Desc:
    """The descriptor every rank must agree on: op, sequence number, dtype, reduction, root,
    bytes (``redop`` NO_REDOP and ``root`` -1 when they do not apply)."""
    detail = DTYPE_CODES.get(dtype, 0) | (redop & 0xFF) << 8 | (root + 1) << 16
    return Desc(seq, OP_CODES[op], detail, nbytes)


class ShmNativeBackend(NativeBackend):
    """NativeBackend plus shared memory on one host (see the module docstring).

    Attributes:
        shm_reason: why the group does not use shared memory ("" when it does).
        hierarchy: the shm_hierarchy.Hierarchy of a group spanning hosts that uses shared
            memory within each host (None otherwise).
        topology: what the group uses, in words (for tests and for debugging performance).
    """

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        self._space: ShmSpace | None = None
        self._descs: dict[tuple[str, torch.dtype, int, int], Desc] = {}
        self._shared: SharedBuffers | None = None
        self._shared_at: dict[int, tuple[int, int]] = {}  # data_ptr -> (index, nbytes)
        self.shm_reason = "a group of one rank has no peers" if ctx.size == 1 else ""
        self.hierarchy: Any = None  # a shm_hierarchy.Hierarchy for a group spanning hosts
        self.topology = "sockets"  # what the group uses, in words
        if ctx.size > 1:
            deadline = time.monotonic() + ctx.timeout.total_seconds()
            settings = {"chunk": _config.SHM_CHUNK_BYTES.get(),
                        "oneshot": _config.SHM_ONESHOT_BYTES.get()}
            domain, self.shm_reason = open_domain(
                ctx.store, ctx.rank, ctx.size, ctx.group_name, host_identity(),
                _config.SHM.get(), _config.SHM_MAX_BYTES.get(), deadline, describe, settings)
            if domain is not None:
                self.topology = f"1 host: ranks {list(range(ctx.size))} through shared memory"
                domain.poll_failure = lambda: self._cause
                domain.on_failure = lambda message: self._abort_local(message, tell_peers=True)
                self._space = ShmSpace(domain, domain.settings["chunk"],
                                       domain.settings["oneshot"])
                self._shared = SharedBuffers(domain)
            else:
                self._open_hierarchy(deadline)
                log.debug("group '%s' uses %s %s", ctx.group_name, self.topology,
                          self.shm_reason)

    def _open_hierarchy(self, deadline: float) -> None:
        """A group spanning hosts: shared memory within each host, sockets across
        (shm_hierarchy.py), when every rank's records allow it."""
        from ringtorch.collectives.backends.shm_hierarchy import open_hierarchy

        hierarchy, why = open_hierarchy(self, deadline)
        self.shm_reason = why or ("" if hierarchy else self.shm_reason)
        if hierarchy is not None:
            self.hierarchy = hierarchy
            self.topology = hierarchy.description
            hierarchy.install()

    @property
    def uses_shm(self) -> bool:
        """Whether this group's collectives go through shared memory (on one host, or
        within each host of a group spanning hosts)."""
        return self._space is not None or self.hierarchy is not None

    def _desc(self, op: str, seq: int, dtype: torch.dtype, redop: int, root: int,
              nbytes: int) -> Desc:
        key = (op, dtype, redop, root)
        found = self._descs.get(key)
        if found is None:
            found = self._descs[key] = make_desc(op, 0, dtype, redop, root, 0)
        return Desc(seq, found.kind, found.detail, nbytes)

    # -- tensors in shared memory ---------------------------------------------------------------

    def shared_tensor(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A zero-filled 1-D tensor whose storage lives in this group's shared memory; an
        all_reduce of exactly this tensor then skips the copy in (shm_shared.py).

        Collective: every rank of the group calls it with the same ``numel`` and ``dtype``, in
        the same place among the group's collectives (like a collective). Allocate once (DDP
        buckets), not per step: the memory stays mapped until the backend is closed. Without
        shared memory (sockets, a group spanning hosts, one rank) or when some rank cannot get
        the memory, it returns an ordinary tensor, so callers need no other path.

        Raises:
            DistBackendError: a peer died, aborted, is in a collective or is late.
        """
        shared = self._shared
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if shared is None or nbytes == 0:
            return torch.zeros(numel, dtype=dtype)
        self._check_usable("shared_tensor")
        desc = Desc(SHARED_SEQ_BASE + len(shared), SHARED_TENSOR_KIND, DTYPE_CODES.get(dtype, 0),
                    nbytes)
        got = shared.allocate(nbytes, desc, time.monotonic() + self.ctx.timeout.total_seconds())
        if got is None:
            return torch.zeros(numel, dtype=dtype)
        index, data = got
        tensor = torch.from_numpy(data).view(dtype)
        self._shared_at[tensor.data_ptr()] = (index, nbytes)
        return tensor

    # -- collectives through shared memory -------------------------------------------------------

    def all_reduce(self, buf: torch.Tensor, op: Any, seq: int, deadline: float) -> None:
        """See base class."""
        space = self._space
        if space is None:
            return super().all_reduce(buf, op, seq, deadline)
        kind, reducer = self._plan_reduce(op, buf.dtype, "all_reduce")
        with self._collective("all_reduce", seq, deadline):
            factor = premul_factor(op) if kind is RedOpType.PREMUL_SUM else None
            if factor is not None:
                buf.mul_(factor)
            data = _bytes(buf)
            desc = self._desc("all_reduce", seq, buf.dtype, int(kind), -1, data.nbytes)
            at = self._shared_at.get(buf.data_ptr()) if self._shared_at else None
            if at is not None and at[1] == data.nbytes and self._shared is not None:
                desc = desc._replace(detail=desc.detail | (at[0] + 1) << SHARED_SHIFT)
                self._shared.all_reduce(at[0], reducer, buf.element_size(), desc, deadline)
            elif kind is RedOpType.AVG and buf.dtype in _DIVIDED_IN_PLACE:
                shm_reduce.all_reduce(space, data, reducer, buf.element_size(), desc, deadline,
                                      self._avg_finisher(buf.dtype))
                return
            else:
                shm_reduce.all_reduce(space, data, reducer,
                                      buf.element_size(), desc, deadline)
            if kind is RedOpType.AVG:
                finish_avg(buf, self.size)

    def _avg_finisher(self, dtype: torch.dtype) -> Any:
        """AVG's division applied to reduced bytes of ``dtype`` as they are produced (the bits
        are finish_avg's)."""
        size, np_dtype = self.size, _DIVIDED_IN_PLACE[dtype]

        def finish(reduced: Any) -> None:
            values = reduced.view(np_dtype)
            np.divide(values, size, out=values)

        return finish

    def reduce(self, buf: torch.Tensor, op: Any, root: int, seq: int, deadline: float) -> None:
        """See base class."""
        space = self._space
        if space is None:
            return super().reduce(buf, op, root, seq, deadline)
        kind, reducer = self._plan_reduce(op, buf.dtype, "reduce")
        self._check_root(root, "reduce")
        with self._collective("reduce", seq, deadline):
            factor = premul_factor(op) if kind is RedOpType.PREMUL_SUM else None
            if factor is not None:
                buf.mul_(factor)
            data = _bytes(buf)
            # only the root reduces, so the root's op is the one applied and the others' is
            # not compared (torch's gloo does the same; seed 003's reduce relies on it)
            desc = self._desc("reduce", seq, buf.dtype, NO_REDOP, root, data.nbytes)
            shm_reduce.reduce(space, data, reducer, root,
                              buf.element_size(), desc, deadline)
            if kind is RedOpType.AVG and self.rank == root:
                finish_avg(buf, self.size)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: Any, seq: int,
                       deadline: float) -> None:
        """See base class."""
        space = self._space
        if space is None:
            return super().reduce_scatter(out, inp, op, seq, deadline)
        kind, reducer = self._plan_reduce(op, inp.dtype, "reduce_scatter")
        check_sizes("reduce_scatter", inp, out, self.size)
        with self._collective("reduce_scatter", seq, deadline):
            factor = premul_factor(op) if kind is RedOpType.PREMUL_SUM else None
            if factor is not None:
                inp = inp * factor
            inp_bytes = _bytes(inp)
            desc = self._desc("reduce_scatter", seq, inp.dtype, int(kind), -1, inp_bytes.nbytes)
            shm_reduce.reduce_scatter(space, _bytes(out), inp_bytes,
                                      reducer, inp.element_size(), desc,
                                      deadline)
            if kind is RedOpType.AVG:
                finish_avg(out, self.size)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, seq: int, deadline: float) -> None:
        """See base class."""
        space = self._space
        if space is None:
            return super().all_gather(out, inp, seq, deadline)
        check_sizes("all_gather", out, inp, self.size)
        with self._collective("all_gather", seq, deadline):
            inp_bytes = _bytes(inp)
            desc = self._desc("all_gather", seq, inp.dtype, NO_REDOP, -1, inp_bytes.nbytes)
            shm_copy.all_gather(space, _bytes(out), inp_bytes, inp.element_size(), desc,
                                deadline)

    def broadcast(self, buf: torch.Tensor, root: int, seq: int, deadline: float) -> None:
        """See base class."""
        space = self._space
        if space is None:
            return super().broadcast(buf, root, seq, deadline)
        self._check_root(root, "broadcast")
        with self._collective("broadcast", seq, deadline):
            data = _bytes(buf)
            desc = self._desc("broadcast", seq, buf.dtype, NO_REDOP, root, data.nbytes)
            shm_copy.broadcast(space, data, root, buf.element_size(), desc, deadline)

    def barrier(self, seq: int, deadline: float) -> None:
        """See base class."""
        space = self._space
        if space is None:
            return super().barrier(seq, deadline)
        with self._collective("barrier", seq, deadline):
            shm_copy.barrier(space, self._desc("barrier", seq, torch.uint8, NO_REDOP, -1, 0),
                             deadline)

    def gather(self, out: torch.Tensor | None, inp: torch.Tensor, root: int, seq: int,
               deadline: float) -> None:
        """See base class."""
        space = self._space
        if space is None:
            self._publish("gather", seq, inp, root)
            return super().gather(out, inp, root, seq, deadline)
        self._check_root(root, "gather")
        check_rooted("gather", self.rank, root, out, inp, self.size)
        with self._collective("gather", seq, deadline):
            inp_bytes = _bytes(inp)
            desc = self._desc("gather", seq, inp.dtype, NO_REDOP, root, inp_bytes.nbytes)
            shm_copy.gather(space, None if out is None else _bytes(out), inp_bytes, root,
                            inp.element_size(), desc, deadline)

    def scatter(self, out: torch.Tensor, inp: torch.Tensor | None, root: int, seq: int,
                deadline: float) -> None:
        """See base class."""
        space = self._space
        if space is None:
            self._publish("scatter", seq, out, root)
            return super().scatter(out, inp, root, seq, deadline)
        self._check_root(root, "scatter")
        check_rooted("scatter", self.rank, root, inp, out, self.size)
        with self._collective("scatter", seq, deadline):
            out_bytes = _bytes(out)
            desc = self._desc("scatter", seq, out.dtype, NO_REDOP, root, out_bytes.nbytes)
            shm_copy.scatter(space, out_bytes, None if inp is None else _bytes(inp), root,
                             out.element_size(), desc, deadline)

    # -- collectives that stay on sockets: publish where this rank is -----------------------------

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                   in_splits: list[int], seq: int, deadline: float) -> None:
        """See base class."""
        self._publish("all_to_all", seq, inp, -1)
        super().all_to_all(out, inp, out_splits, in_splits, seq, deadline)

    def _publish(self, op: str, seq: int, tensor: torch.Tensor, root: int) -> None:
        if self._space is not None:
            nbytes = tensor.numel() * tensor.element_size()
            self._space.domain.enter(make_desc(op, seq, tensor.dtype, NO_REDOP, root, nbytes))

    # -- lifetime --------------------------------------------------------------------------------

    def abort(self, reason: str) -> None:
        """See base class."""
        if self._space is not None:
            self._space.domain.abort(f"rank {self.rank} aborted the group: {reason}")
        super().abort(reason)

    def close(self) -> None:
        """See base class."""
        super().close()
        space, self._space = self._space, None
        if self._shared is not None:
            self._shared.close()
            self._shared_at.clear()
        if space is not None:
            space.close()
            space.domain.close()


__all__ = ["SHARED_TENSOR_KIND", "ShmNativeBackend", "describe", "make_desc"]

"""A fake NCCL for tests without a GPU: ringtorch's CPU collectives with NCCL's enqueue-on-a-
stream semantics, on the simulated device runtime.

Selected by ``RINGTORCH_NCCL_FAKE`` (test-only; ``docs/env-vars.md``). It keeps the contract of
``ringtorch._device.nccl_comm`` (see there): ``init_rank`` returns at once and joins in a
thread (an inner ringtorch ProcessGroup on ringtorch's native backend, met through the group's
store under the unique id); each operation enqueues on the given simulated stream a closure
that runs the matching CPU collective on the device tensors (the simulator's device memory is
CPU memory), so it runs in that stream's order, after the work queued before it, and its
completion is seen by an event recorded after it. Like NCCL, the fake has no timeout of its
own: a stalled operation or a hung init waits until :meth:`FakeComm.abort`; a peer that dies
sets the async error (ncclRemoteError) with the inner group's message, which names the peer.

Faults, for tests: ``RINGTORCH_NCCL_FAKE=hang_init`` (the init never completes),
``version=2.28.9`` (the version reported), and :meth:`FakeComm.stall_next` (the next operation
never completes).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from ringtorch import _config
from ringtorch._device import nccl_comm, nccl_lib
from ringtorch.collectives.backends import registry
from ringtorch.collectives.backends.base import BackendContext
from ringtorch.collectives.options import (
    AllreduceOptions,
    BroadcastOptions,
    ReduceOptions,
    ReduceScatterOptions,
)
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.collectives.reduce_op import ReduceOp
from ringtorch.store import PrefixStore

# NCCL has no timeout: the inner group's is only a backstop far beyond any test's
_INNER_TIMEOUT = timedelta(hours=1)
_OPS = {nccl_lib.SUM: ReduceOp.SUM, nccl_lib.PROD: ReduceOp.PRODUCT, nccl_lib.MAX: ReduceOp.MAX,
        nccl_lib.MIN: ReduceOp.MIN, nccl_lib.AVG: ReduceOp.AVG}


def enabled() -> bool:
    """Whether backend "nccl" uses this fake (``RINGTORCH_NCCL_FAKE`` set)."""
    return bool(_config.NCCL_FAKE.get())


def _options() -> dict[str, str]:
    words = [w.strip() for w in _config.NCCL_FAKE.get().split(",") if w.strip()]
    return dict(w.partition("=")[::2] for w in words)


class FakeNccl:
    """:class:`~ringtorch._device.nccl_comm.Library` over ringtorch's CPU collectives; made per
    group with the group's private store and names (for the inner group's messages)."""

    def __init__(self, store: Any, group_name: str, global_ranks: tuple[int, ...]) -> None:
        self._store = store
        self._group_name = group_name
        self._global_ranks = global_ranks
        options = _options()
        self._hang_init = "hang_init" in options
        major, minor, patch = (int(x) for x in options.get("version", "2.32.3").split("."))
        self._version = major * 10000 + minor * 100 + patch

    def version(self) -> int:
        return self._version

    def unique_id(self) -> bytes:
        return os.urandom(nccl_lib.UNIQUE_ID_BYTES)

    def init_rank(self, nranks: int, unique_id: bytes, rank: int, device: int) -> FakeComm:
        ctx = BackendContext(
            store=PrefixStore(f"nccl-fake/{unique_id[:8].hex()}/", self._store), rank=rank,
            size=nranks, timeout=_INNER_TIMEOUT, group_name=self._group_name,
            global_ranks=self._global_ranks)
        return FakeComm(ctx, hang=self._hang_init)


class FakeComm:
    """:class:`~ringtorch._device.nccl_comm.Communicator` running the inner group's CPU
    collectives on simulated streams (see the module docstring)."""

    def __init__(self, ctx: BackendContext, hang: bool) -> None:
        self.rank = ctx.rank
        self.nranks = ctx.size
        self._aborted = threading.Event()
        self._lock = threading.Lock()
        self._pg: ProcessGroup | None = None
        self._error = nccl_comm.IN_PROGRESS
        self._text = ""
        self._stall = False
        self._grouped: list[tuple[str, torch.Tensor, int]] | None = None
        self._group_stream: Any = None
        threading.Thread(target=self._join, args=(ctx, hang), daemon=True,
                         name=f"fake-nccl-init-{ctx.group_name}").start()

    def _join(self, ctx: BackendContext, hang: bool) -> None:
        if hang:  # a peer that never arrives, as NCCL sees it: no progress until abort
            self._aborted.wait()
            return
        try:
            impl = registry.create("gloo", ctx)
            pg = ProcessGroup(ctx.store, ctx.rank, ctx.size, backend=impl,
                              group_name=ctx.group_name, timeout=ctx.timeout,
                              global_ranks=ctx.global_ranks)
        except Exception as exc:
            self._fail(nccl_comm.REMOTE_ERROR, str(exc))
            return
        with self._lock:
            if self._aborted.is_set():
                pg.abort("the NCCL communicator was aborted")
                return
            self._pg, self._error = pg, nccl_comm.SUCCESS

    def _fail(self, code: int, text: str) -> None:
        with self._lock:
            if self._error in (nccl_comm.SUCCESS, nccl_comm.IN_PROGRESS):
                self._error, self._text = code, text

    def stall_next(self) -> None:
        """Fault injection: the next operation enqueued never completes (until abort)."""
        self._stall = True

    def async_error(self) -> int:
        return self._error

    def error_text(self) -> str:
        return self._text

    def abort(self) -> None:
        with self._lock:
            self._aborted.set()
            pg = self._pg
        if pg is not None:
            pg.abort("the NCCL communicator was aborted")

    def destroy(self) -> None:
        with self._lock:
            pg, self._pg = self._pg, None
        if pg is not None:
            pg.shutdown()

    def _enqueue(self, stream: Any, body: Callable[[ProcessGroup], None]) -> None:
        stall, self._stall = self._stall, False

        def run() -> None:
            if stall:
                self._aborted.wait()
            pg = self._pg
            if pg is None or self._error != nccl_comm.SUCCESS or self._aborted.is_set():
                return  # a failed or aborted communicator does nothing more
            try:
                body(pg)
            except Exception as exc:
                self._fail(nccl_comm.REMOTE_ERROR, str(exc))

        stream.submit("launch", run)

    def all_reduce(self, send: torch.Tensor, recv: torch.Tensor, op: int, stream: Any) -> None:
        def body(pg: ProcessGroup) -> None:
            if send is not recv:
                recv.copy_(send)
            pg.allreduce([recv], AllreduceOptions(reduceOp=_OPS[op], asyncOp=False)).wait()

        self._enqueue(stream, body)

    def broadcast(self, send: torch.Tensor, recv: torch.Tensor, root: int, stream: Any) -> None:
        def body(pg: ProcessGroup) -> None:
            if self.rank == root and send is not recv:
                recv.copy_(send)
            pg.broadcast([recv], BroadcastOptions(rootRank=root, asyncOp=False)).wait()

        self._enqueue(stream, body)

    def reduce(self, send: torch.Tensor, recv: torch.Tensor, op: int, root: int,
               stream: Any) -> None:
        def body(pg: ProcessGroup) -> None:
            buf = send.clone()
            pg.reduce([buf], ReduceOptions(reduceOp=_OPS[op], rootRank=root,
                                           asyncOp=False)).wait()
            if self.rank == root:
                recv.copy_(buf)

        self._enqueue(stream, body)

    def all_gather(self, send: torch.Tensor, recv: torch.Tensor, stream: Any) -> None:
        self._enqueue(stream, lambda pg: pg.all_gather_single(recv, send).wait())

    def reduce_scatter(self, send: torch.Tensor, recv: torch.Tensor, op: int,
                       stream: Any) -> None:
        opts = ReduceScatterOptions(reduceOp=_OPS[op], asyncOp=False)
        self._enqueue(stream, lambda pg: pg.reduce_scatter_single(recv, send, opts).wait())

    def send(self, buf: torch.Tensor, peer: int, stream: Any) -> None:
        self._p2p("send", buf, peer, stream)

    def recv(self, buf: torch.Tensor, peer: int, stream: Any) -> None:
        self._p2p("recv", buf, peer, stream)

    def _p2p(self, kind: str, buf: torch.Tensor, peer: int, stream: Any) -> None:
        if self._grouped is not None:  # inside group_start/end: run together at group_end
            self._grouped.append((kind, buf, peer))
            self._group_stream = stream
            return
        self._enqueue(stream, lambda pg: _run_p2p(pg, [(kind, buf, peer)]))

    def group_start(self) -> None:
        self._grouped = []

    def group_end(self) -> None:
        grouped, self._grouped = self._grouped or [], None
        if grouped:
            self._enqueue(self._group_stream, lambda pg: _run_p2p(pg, grouped))


def _run_p2p(pg: ProcessGroup, ops: list[tuple[str, torch.Tensor, int]]) -> None:
    """Sends and receives that progress together (each peer's lane is its own)."""
    works = [pg.send([buf], peer) if kind == "send" else pg.recv([buf], peer)
             for kind, buf, peer in ops]
    for work in works:
        work.wait()

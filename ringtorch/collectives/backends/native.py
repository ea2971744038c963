"""The native backend: ringtorch's own collectives, over the transport chosen for the group.

A collective runs on the calling thread from start to finish (no hand-off: each one costs
25-60 us on these machines). Each call is checked, its reduction lowered once per (op, dtype)
(lowering.py), named by one CollectiveCall (call.py) and handed, as bytes, to the group's
transport (transports/): shared memory on one host, the hierarchy across hosts, or the socket
algorithms; the transport is chosen once, when the group is made. Point-to-point messages go
through a Mailbox (reader threads on separate connections), so they may be used from any
thread while collectives run.

Failures (see docs/design/failure-detection.md): a peer's EOF seen by a reader thread, an
ABORT frame, a shared-memory liveness probe, a timeout or a mismatch posts its cause to the
group's AbortState (first cause wins), fails every blocked call (sockets shut down, the
segment's abort flag set) and every later call raises ``DistBackendError`` with that cause at
once; ``PeerLostError`` (also a ``DistNetworkError``) when the cause is a lost connection: a
peer whose process exited, or one the network cut off. Collectives on one backend must not
overlap (the ProcessGroup orders them).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import torch

from ringtorch import _config
from ringtorch._buffers import as_bytes, bytes_at, typed_view
from ringtorch._errors import DistBackendError, PeerLostError
from ringtorch._observe.hang_ask import HANG
from ringtorch._observe.operation import Operation
from ringtorch._wire import mailbox as mb
from ringtorch._wire.errors import DeadlineExceeded, PeerClosedError, PeerUnreachableError
from ringtorch._wire.mesh import FrameMismatch, PeerMesh
from ringtorch._wire.mesh_setup import connect_mesh
from ringtorch.collectives.abort import AbortState
from ringtorch.collectives.algorithms.select import parse_overrides
from ringtorch.collectives.backends import native_parts
from ringtorch.collectives.backends.base import Backend, BackendContext
from ringtorch.collectives.backends.native_route import route_of
from ringtorch.collectives.backends.native_status import (
    StatusBoard,
)
from ringtorch.collectives.backends.native_wait import DeadlinePassed, WaitWatch
from ringtorch.collectives.call import CallMaker, CollectiveCall, Signature
from ringtorch.collectives.lowering import (
    Lowering,
    ignore_fp_errors,
    lower,
    restore_fp_errors,
    scale,
)
from ringtorch.collectives.reduce_op import RedOpType, op_type, premul_factor
from ringtorch.collectives.reports import Words
from ringtorch.collectives.transports.base import Transport
from ringtorch.collectives.transports.setup import open_transport

_new_call = tuple.__new__  # CollectiveCall from (*signature, seq, nbytes, deadline): call.new_call

class NativeBackend(Backend):
    """See the module docstring and base.Backend.

    Attributes:
        transport: the group's Transport (sockets, shared memory or the hierarchy).
        abort_state: the group's AbortState (its ``cause`` is None while it is healthy).
        uses_shm: whether collectives go through shared memory.
        shm_reason: why the group does not use shared memory ("" when it does).
        topology: what the group uses, in words (for tests and for debugging performance).
    """

    supports_shrinking = True

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        self.abort_state = AbortState()
        self._closed = False
        self._bye: set[int] = set()
        self._gone: set[int] = set()
        self._board = StatusBoard()
        self._words = Words(ctx.group_name, ctx.global_ranks)
        self._calls = CallMaker(ctx.group_name)
        self._lowered: dict[tuple[RedOpType, torch.dtype, str], Lowering] = {}
        self._all_reduce_plans: dict[tuple[RedOpType, torch.dtype], tuple[Lowering, Signature]] = {}
        self._shared_at: dict[int, tuple[int, int]] = {}  # data_ptr -> (index, nbytes)
        self._views: dict[tuple[int, int], np.ndarray] = {}  # all_reduce's (see there)
        self._mesh: PeerMesh | None = None
        self._mailbox: mb.Mailbox | None = None
        self._watch = WaitWatch(self._board, self._words, self.abort_state, ctx.rank, ctx.size)
        if ctx.size > 1:
            deadline = ctx.setup_deadline
            self._mesh = connect_mesh(ctx.store, ctx.rank, ctx.size, ctx.group_name, deadline)
            self._mesh.on_slow_wait = self._watch.slow_wait
            self._words.hosts = self._mesh.hosts
            self._mailbox = mb.Mailbox(ctx.rank, self._mesh.p2p, self._on_event,
                                       name=ctx.group_name)
            self._mailbox.start()
            self._watch.mailbox = self._mailbox
        self.transport: Transport
        self.transport, self.shm_reason = open_transport(
            ctx, self._mesh, parse_overrides(_config.ALGORITHMS.get()), self.abort_state,
            self._abort_local)
        self._watch.transport = self.transport
        space = getattr(self.transport, "space", None)
        if space is not None:  # shared-memory waits begin the hang report ahead, too
            space.domain.poll_failure = self._watch.shm_poll
        self.uses_shm = self.transport.uses_shm
        self.topology = self.transport.description

    def route(self, record: Any) -> tuple[str, str]:
        """See base class (native_route.py)."""
        return route_of(self.transport, record.call)

    @property
    def one_host(self) -> bool:
        """See base class: from the mesh the group's rendezvous built."""
        return self._mesh is None or all(self._mesh.same_host)

    @property
    def shares_memory(self) -> bool:
        """See base class: on one host's shared memory."""
        return self.transport.shares_memory

    # -- failure handling --------------------------------------------------------------------

    def _abort_local(self, cause: str, tell_peers: bool = True, lost: bool = False) -> None:
        """Post the cause (the first one wins; ``lost``: it is a lost connection), fail every
        receive, tell the peers (ABORT frames carry the cause, so a peer learns the real
        culprit before it sees this rank's connections close), then shut every connection
        down to wake blocked calls."""
        if not self.abort_state.post(cause, lost):
            return
        if self._mailbox is not None:
            self._mailbox.fail(self._error(f"the group was aborted: {cause}"))
        if threading.current_thread().name.startswith("ringtorch-p2p"):
            # a reader thread must not block on a send lock: tell the peers from another thread
            threading.Thread(target=self._tell_and_shutdown, args=(cause, tell_peers),
                             daemon=True, name="ringtorch-abort").start()
        else:
            self._tell_and_shutdown(cause, tell_peers)

    def _tell_and_shutdown(self, cause: str, tell_peers: bool) -> None:
        if tell_peers and self._mailbox is not None:
            kind = mb.ABORT_LOST if self.abort_state.lost else mb.ABORT
            for peer in range(self.size):
                if peer != self.rank and peer not in self._gone:
                    self._mailbox.send_control(peer, kind, cause.encode()[:60000], 0.5)
        if self._mesh is not None:
            self._mesh.shutdown()

    def abort(self, reason: str) -> None:
        """See base class."""
        cause = f"rank {self.rank} aborted the group: {reason}"
        self.transport.abort(cause)
        self._abort_local(cause, tell_peers=True)

    def _on_event(self, peer: int, kind: str, payload: bytes) -> None:
        """Called on reader threads: must not block on anything a sender may hold."""
        if kind in ("abort", "abort_lost"):
            self._gone.add(peer)
            self._abort_local(payload.decode(errors="replace"), lost=kind == "abort_lost")
        elif kind == "bye":
            self._bye.add(peer)
        elif kind == "eof":
            self._gone.add(peer)
            if self._closed:
                return
            if peer in self._bye:
                assert self._mailbox is not None
                self._mailbox.fail_peer(peer, DistBackendError(
                    f"{self._words.who(peer)} has closed its process group"))
                return
            self._abort_local(self._words.peer_left(peer, self.rank), lost=True)
        elif kind == "unreachable":
            self._gone.add(peer)
            if not self._closed:
                self._abort_local(self._words.peer_unreachable(
                    peer, self.rank, payload.decode(errors="replace")), lost=True)
        elif kind == "status_request" and self._mailbox is not None:
            self._board.answer(self._mailbox, peer)
        elif kind == "status":
            self._board.on_status(peer, payload)

    def _error(self, message: str) -> DistBackendError:
        """The error of a failed operation: a PeerLostError (also a DistNetworkError) when
        the group's abort cause is a lost connection, else a DistBackendError."""
        return PeerLostError(message) if self.abort_state.lost else DistBackendError(message)

    def _check_usable(self, what: str) -> None:
        if self._closed:
            raise DistBackendError(self._words.closed(what))
        cause = self.abort_state.cause
        if cause is not None:
            raise self._error(self._words.aborted(what, cause))

    def _enter(self, call: CollectiveCall, o: Operation) -> NativeBackend:
        """The scope of one collective (``with self._enter(call, o):``): refuses to start on
        a failed group, attaches the call and the route to the operation, points the status
        board at it (where this rank is, for peers' status queries and for timeouts), turns
        transport failures into DistBackendError and aborts the group on them. The backend
        is its own context manager: cheaper than a generator or an object per call; what
        one call must undo is kept on its operation, not here."""
        if self._closed or self.abort_state.cause is not None:
            self._check_usable(self._words.what(call))
        o.call = call
        o.route = self
        board = self._board
        board.op = o
        board.running = True
        return self

    def __enter__(self) -> None:
        self._board.op.scratch = ignore_fp_errors()  # type: ignore[union-attr]

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        board = self._board
        o = board.op
        restore_fp_errors(o.scratch)  # type: ignore[union-attr]
        board.running = False
        if exc is not None:
            error = self._collective_failed(exc)
            # names its hang report (begun ahead of the deadline, or made now)
            call = board.call
            HANG.on_collective_failure(self._words.group, error or exc,
                                       None if call is None else call.seq)
            if error is not None:
                raise error from None

    def _collective_failed(self, exc: BaseException) -> BaseException | None:
        """The DistBackendError for a failure inside a collective (None: not ours)."""
        call = self._board.call
        assert call is not None
        if isinstance(exc, FrameMismatch):
            message = self._words.mismatched_frame(call, self.rank, exc.peer, exc.expected,
                                                   exc.got)
            self._abort_local(message, tell_peers=True)
            return DistBackendError(message)
        if isinstance(exc, DeadlinePassed):
            self._abort_local(str(exc), tell_peers=True)
            return DistBackendError(str(exc))
        if isinstance(exc, PeerClosedError):
            cause = self._peer_lost_cause(exc, exc.peer)
            return self._error(self._words.failed(self._words.what(call), cause))
        if isinstance(exc, DistBackendError) and self.abort_state.lost:
            # a shared-memory wait ended by the group's abort for a lost connection
            return PeerLostError(str(exc))
        # Anything else (KeyboardInterrupt, MemoryError, a bug) stopped this rank half way
        # through its frames: the streams are out of step, so the group cannot go on.
        self._abort_local(self._words.interrupted(call, self.rank, exc), tell_peers=True)
        return None

    def _peer_lost_cause(self, exc: PeerClosedError, peer: int) -> str:
        # A reader thread usually explains the loss first (EOF of the dead peer, an ABORT
        # frame); wait for it a moment, since the connection we were using may only have
        # been shut down because of another peer's death.
        cause = self.abort_state.wait(0.2)
        if cause is None:
            unreachable = getattr(exc, "unreachable", "") or (
                exc.reason if isinstance(exc, PeerUnreachableError) else "")
            self._abort_local(self._words.peer_lost(peer, self.rank, peer in self._bye, exc,
                                                    unreachable),
                              tell_peers=True, lost=peer not in self._bye or bool(unreachable))
        return f"the group was aborted: {self.abort_state.cause}"

    # -- plumbing ----------------------------------------------------------------------------

    def _lower(self, op: Any, dtype: torch.dtype, opname: str) -> Lowering:
        """The lowering of ``op`` on ``dtype``, checked once per pair.

        Raises:
            ValueError, RuntimeError: the pair has no meaning (reduce_op.check_reduce_op).
        """
        kind = op if type(op) is RedOpType else op_type(op)
        found = self._lowered.get((kind, dtype, opname))
        if found is None:
            found = self._lowered[(kind, dtype, opname)] = lower(kind, dtype, opname, self.size)
        return found

    # -- collectives -------------------------------------------------------------------------

    def all_reduce(self, buf: torch.Tensor, op: Any, o: Operation) -> None:
        """See base class."""
        kind = op if type(op) is RedOpType else op_type(op)
        hot = self._all_reduce_plans.get((kind, buf.dtype))
        if hot is None:  # the lowering and the call's signature, once per (op, dtype)
            low = self._lower(op, buf.dtype, "all_reduce")
            hot = self._all_reduce_plans[(kind, buf.dtype)] = (low, self._calls.signature(
                "all_reduce", buf.dtype, kind, -1))
        low, sig = hot
        factor = premul_factor(op) if low.scales else None
        # the bytes' view, per (address, size): a training loop all-reduces the same few
        # buffers; the view holds nothing alive (the caller's tensor outlives this call)
        key = (buf.data_ptr(), buf.nbytes)
        data = self._views.get(key)
        if data is None or buf.is_neg() or buf.is_conj():
            data = as_bytes(buf)  # refuses a tensor whose memory does not hold its values
            if len(self._views) >= 64:
                self._views.clear()
            self._views[key] = bytes_at(*key)
        call = _new_call(CollectiveCall, (*sig, o.seq, data.nbytes, o.deadline))
        if self._shared_at:
            at = self._shared_at.get(buf.data_ptr())
            if at is not None and at[1] == data.nbytes:
                call = call.on_shared(at[0])
        with self._enter(call, o):
            if factor is not None:
                scale(buf, factor, in_place=True)
            self.transport.all_reduce(call, data, low.reducer, low.itemsize, low.post)

    def broadcast(self, buf: torch.Tensor, root: int, o: Operation) -> None:
        """See base class."""
        data = as_bytes(buf)
        call = self._calls("broadcast", o.seq, buf.dtype, None, root, data.nbytes, o.deadline)
        with self._enter(call, o):
            self.transport.broadcast(call, data, buf.element_size())

    def reduce(self, buf: torch.Tensor, op: Any, root: int, o: Operation) -> None:
        """See base class."""
        low = self._lower(op, buf.dtype, "reduce")
        factor = premul_factor(op) if low.scales else None
        data = as_bytes(buf)
        call = self._calls("reduce", o.seq, buf.dtype, low.kind, root, data.nbytes, o.deadline)
        with self._enter(call, o):
            if factor is not None:
                scale(buf, factor, in_place=True)
            self.transport.reduce(call, data, low.reducer, low.itemsize)
            if low.post is not None and self.rank == root:
                low.post(data)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, o: Operation) -> None:
        """See base class."""
        inp_bytes = as_bytes(inp)
        call = self._calls("all_gather", o.seq, inp.dtype, None, -1, inp_bytes.nbytes, o.deadline)
        with self._enter(call, o):
            self.transport.all_gather(call, as_bytes(out), inp_bytes, inp.element_size())

    def gather(self, out: torch.Tensor | None, inp: torch.Tensor, root: int,
               o: Operation) -> None:
        """See base class."""
        inp_bytes = as_bytes(inp)
        call = self._calls("gather", o.seq, inp.dtype, None, root, inp_bytes.nbytes, o.deadline)
        with self._enter(call, o):
            self.transport.gather(call, None if out is None else as_bytes(out), inp_bytes,
                                  inp.element_size())

    def scatter(self, out: torch.Tensor, inp: torch.Tensor | None, root: int,
                o: Operation) -> None:
        """See base class."""
        out_bytes = as_bytes(out)
        call = self._calls("scatter", o.seq, out.dtype, None, root, out_bytes.nbytes, o.deadline)
        with self._enter(call, o):
            self.transport.scatter(call, out_bytes, None if inp is None else as_bytes(inp),
                                   out.element_size())

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: Any,
                       o: Operation) -> None:
        """See base class."""
        low = self._lower(op, inp.dtype, "reduce_scatter")
        factor = premul_factor(op) if low.scales else None
        nbytes = inp.numel() * low.itemsize
        call = self._calls("reduce_scatter", o.seq, inp.dtype, low.kind, -1, nbytes, o.deadline)
        with self._enter(call, o):
            if factor is not None:
                inp = scale(inp, factor, in_place=False)
            out_bytes = as_bytes(out)
            self.transport.reduce_scatter(call, out_bytes, as_bytes(inp), low.reducer,
                                          low.itemsize)
            if low.post is not None:
                low.post(out_bytes)

    all_gather_parts = native_parts.all_gather_parts
    reduce_scatter_parts = native_parts.reduce_scatter_parts

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                   in_splits: list[int], o: Operation) -> None:
        """See base class."""
        size = inp.element_size()
        call = self._calls("all_to_all", o.seq, inp.dtype, None, -1, inp.numel() * size, o.deadline)
        with self._enter(call, o):
            out_offsets = [0, *np.cumsum(out_splits).tolist()]
            in_offsets = [0, *np.cumsum(in_splits).tolist()]
            self.transport.all_to_all(call, as_bytes(out), as_bytes(inp),
                                      [x * size for x in out_offsets],
                                      [x * size for x in in_offsets])

    def barrier(self, o: Operation) -> None:
        """See base class."""
        call = self._calls("barrier", o.seq, torch.uint8, None, -1, 0, o.deadline)
        with self._enter(call, o):
            self.transport.barrier(call)

    # -- tensors in shared memory ---------------------------------------------------------------

    def shared_tensor(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """See base class: on one host, in the group's shared memory (an all_reduce of exactly
        this tensor then skips the copy in: algorithms/shm/shared.py); elsewhere, or when
        some rank cannot get the memory, an ordinary tensor.

        Raises:
            DistBackendError: a peer died, aborted, is in a collective or is late.
        """
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if not self.transport.shares_memory or nbytes == 0:
            return torch.zeros(numel, dtype=dtype)
        self._check_usable("shared_tensor")
        call = self._calls.shared_tensor(len(self._shared_at), dtype, nbytes,
                                         time.monotonic() + self.ctx.timeout.total_seconds())
        got = self.transport.shared_buffer(call)
        if got is None:
            return torch.zeros(numel, dtype=dtype)
        index, data = got
        tensor = typed_view(data, dtype)
        self._shared_at[tensor.data_ptr()] = (index, nbytes)
        return tensor

    # -- point to point ------------------------------------------------------------------------

    def send(self, buf: torch.Tensor, dst: int, tag: int, deadline: float) -> None:
        """See base class."""
        what = f"send to rank {dst} (tag {tag}) on group '{self.ctx.group_name}'"
        self._check_usable(what)
        assert self._mailbox is not None
        try:
            self._mailbox.send(dst, tag, as_bytes(buf), deadline)  # type: ignore[arg-type]
        except DeadlineExceeded:
            cause = f"{what} timed out: {self._words.who(dst)} does not read its messages"
            self._abort_local(cause, tell_peers=True)
            raise DistBackendError(cause) from None
        except PeerClosedError as exc:
            raise self._error(f"{what} failed: {self._peer_lost_cause(exc, dst)}") from None

    def recv(self, buf: torch.Tensor, src: int | None, tag: int, deadline: float) -> int:
        """See base class."""
        source = "any rank" if src is None else f"rank {src}"
        what = f"recv from {source} (tag {tag}) on group '{self.ctx.group_name}'"
        self._check_usable(what)
        if self._mailbox is None:
            raise ValueError(f"{what}: a group of one rank has nobody to receive from")
        try:
            return self._mailbox.recv(as_bytes(buf), src, tag, deadline)  # type: ignore[arg-type]
        except mb.RecvError as exc:
            error = exc.args[0]
            if isinstance(error, PeerClosedError) and src is not None:
                raise self._error(f"{what} failed: {self._peer_lost_cause(error, src)}") \
                    from None
            cause = self.abort_state.cause
            if isinstance(error, PeerClosedError) and cause is not None:
                raise self._error(self._words.aborted(what, cause)) from None
            raise self._error(f"{what} failed: {error}") from None
        except DeadlineExceeded:
            raise DistBackendError(f"{what} timed out: no matching message arrived") from None

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """See base class."""
        if self._closed:
            return
        self._closed = True
        if self._mailbox is not None:
            for peer in range(self.size):
                if peer != self.rank:
                    self._mailbox.send_control(peer, mb.BYE, b"", 0.2)
        if self._mesh is not None:
            self._mesh.shutdown()
        if self._mailbox is not None:
            self._mailbox.fail(DistBackendError(
                f"the process group '{self.ctx.group_name}' was closed"))
            self._mailbox.join(1.0)
        if self._mesh is not None:
            self._mesh.close()
        self._shared_at.clear()
        self._views.clear()
        self.transport.close()


__all__ = ["NativeBackend"]

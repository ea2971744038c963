"""The native backend: ringtorch's own collectives over a mesh of Unix/TCP sockets.

A collective runs on the calling thread from start to finish (no hand-off: each one costs
25-60 us on these machines): it picks an algorithm (algorithms/select.py), wraps the mesh in
a MeshLink that stamps every frame with (op, dtype, reduce op, root, sequence number, sizes)
and checks every frame it receives, and runs the algorithm on the tensors' own bytes.
Point-to-point messages go through a Mailbox (reader threads on separate connections), so they
may be used from any thread while collectives run.

Failures (see docs/design/failure-detection.md): a peer's EOF seen by a reader thread, an
ABORT frame, a timeout or a mismatch aborts the backend: the cause is recorded, every blocked
call is woken (sockets shut down), every later call raises ``DistBackendError`` with the same
cause at once. Collectives on one backend must not overlap (the ProcessGroup orders them).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch

from ringtorch import _config
from ringtorch._errors import DistBackendError
from ringtorch._wire import mailbox as mb
from ringtorch._wire.errors import DeadlineExceeded, PeerClosedError
from ringtorch._wire.mesh import NO_REDOP, NO_ROOT, FrameMismatch, PeerMesh
from ringtorch._wire.mesh_setup import connect_mesh
from ringtorch.collectives.algorithms import direct, recursive_doubling, ring, tree
from ringtorch.collectives.algorithms.link import MeshLink, ScratchPool
from ringtorch.collectives.algorithms.select import choose, parse_overrides
from ringtorch.collectives.backends.base import Backend, BackendContext
from ringtorch.collectives.backends.native_status import (
    DTYPE_CODES,
    OP_CODES,
    Scope,
    SoloLink,
    StatusBoard,
    check_peer,
    check_rooted,
    check_sizes,
    check_splits,
    describe_header,
    frame_sizes,
    missing_report,
)
from ringtorch.collectives.reduce_op import (
    RedOpType,
    as_bytes,
    byte_reducer,
    check_reduce_op,
    finish_avg,
    op_type,
    premul_factor,
)

log = logging.getLogger(__name__)


class _Timeout(Exception):
    """Raised inside a wait when the collective's deadline passed; carries the message."""


class NativeBackend(Backend):
    """See the module docstring and base.Backend.

    Subclasses that add a faster path for some ops (the shared-memory backend) may use, and
    this class keeps stable: ``_collective(op, seq, deadline)`` (the scope of one collective:
    refuses a failed group, records progress, turns transport failures into
    DistBackendError), ``_check_root(root, op)``, ``_cause`` (the abort cause or None) and
    ``_abort_local(cause, tell_peers=True)``.
    """

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        self._cause: str | None = None
        self._closed = False
        self._bye: set[int] = set()
        self._gone: set[int] = set()
        self._lock = threading.Lock()
        self._board = StatusBoard()
        self._current: tuple[str, int, float, float] | None = None
        self._warned = False
        self._scratch = ScratchPool()
        self._reducers: dict[tuple[RedOpType, torch.dtype], Any] = {}
        self._choices: dict[tuple[str, int], tuple[str, int]] = {}
        self._scope = Scope(self)
        self._overrides = parse_overrides(_config.ALGORITHMS.get())
        self._mesh: PeerMesh | None = None
        self._mailbox: mb.Mailbox | None = None
        if ctx.size > 1:
            deadline = time.monotonic() + ctx.timeout.total_seconds()
            self._mesh = connect_mesh(ctx.store, ctx.rank, ctx.size, ctx.group_name, deadline)
            self._mesh.on_slow_wait = self._slow_wait
            self._same_host = all(self._mesh.same_host)
            self._mailbox = mb.Mailbox(ctx.rank, self._mesh.p2p, self._on_event,
                                       name=ctx.group_name)
            self._mailbox.start()
        else:
            self._same_host = True

    # -- naming ------------------------------------------------------------------------------

    def _who(self, rank: int) -> str:
        glob = self.ctx.global_ranks[rank] if rank < len(self.ctx.global_ranks) else rank
        return f"rank {rank}" if glob == rank else f"rank {rank} (global rank {glob})"

    def _what(self, op: str, seq: int) -> str:
        return f"{op} #{seq} on group '{self.ctx.group_name}'"

    # -- failure handling --------------------------------------------------------------------

    def _abort_local(self, cause: str, tell_peers: bool = True) -> None:
        """Record the first cause, fail every receive, tell the peers (ABORT frames carry the
        cause, so a peer learns the real culprit before it sees this rank's connections
        close), then shut every connection down to wake blocked calls."""
        with self._lock:
            if self._cause is not None:
                return
            self._cause = cause
        if self._mailbox is not None:
            self._mailbox.fail(DistBackendError(f"the group was aborted: {cause}"))
        if threading.current_thread().name.startswith("ringtorch-p2p"):
            # a reader thread must not block on a send lock: tell the peers from another thread
            threading.Thread(target=self._tell_and_shutdown, args=(cause, tell_peers),
                             daemon=True, name="ringtorch-abort").start()
        else:
            self._tell_and_shutdown(cause, tell_peers)

    def _tell_and_shutdown(self, cause: str, tell_peers: bool) -> None:
        if tell_peers and self._mailbox is not None:
            for peer in range(self.size):
                if peer != self.rank and peer not in self._gone:
                    self._mailbox.send_control(peer, mb.ABORT, cause.encode()[:60000], 0.5)
        if self._mesh is not None:
            self._mesh.shutdown()

    def abort(self, reason: str) -> None:
        """See base class."""
        self._abort_local(f"rank {self.rank} aborted the group: {reason}", tell_peers=True)

    def _on_event(self, peer: int, kind: str, payload: bytes) -> None:
        """Called on reader threads: must not block on anything a sender may hold."""
        if kind == "abort":
            self._gone.add(peer)
            self._abort_local(payload.decode(errors="replace"))
        elif kind == "bye":
            self._bye.add(peer)
        elif kind == "eof":
            self._gone.add(peer)
            if self._closed:
                return
            if peer in self._bye:
                assert self._mailbox is not None
                self._mailbox.fail_peer(peer, DistBackendError(
                    f"{self._who(peer)} has closed its process group"))
                return
            self._abort_local(f"{self._who(peer)} closed its connection to {self._who(self.rank)}"
                              f" of group '{self.ctx.group_name}' without leaving the group: "
                              f"the process exited or was killed")
        elif kind == "status_request" and self._mailbox is not None:
            self._board.answer(self._mailbox, peer)
        elif kind == "status":
            self._board.on_status(peer, payload)

    def _check_usable(self, what: str) -> None:
        if self._closed:
            raise DistBackendError(f"{what}: the process group was closed")
        if self._cause is not None:
            raise DistBackendError(f"{what} failed: the group was aborted: {self._cause}")

    def _collective(self, op: str, seq: int, deadline: float) -> Scope:
        """The scope of one collective: refuses to start on a failed group, records where
        this rank is (for peers' status queries and for timeouts), turns transport failures
        into DistBackendError and aborts the group on them."""
        if self._closed or self._cause is not None:
            self._check_usable(self._what(op, seq))
        self._board.progress = (op, seq, "running")
        self._current = (op, seq, deadline, time.monotonic())
        self._warned = False
        return self._scope

    def _collective_failed(self, exc: BaseException) -> BaseException | None:
        """The DistBackendError for a failure inside a collective (None: not ours)."""
        op, seq = self._board.progress[:2]
        what = self._what(str(op), seq)
        if isinstance(exc, FrameMismatch):
            message = (f"{what}: mismatched collectives: {self._who(self.rank)} runs "
                       f"{describe_header(exc.expected)} but {self._who(exc.peer)} sent "
                       f"{describe_header(exc.got)}{frame_sizes(exc.expected, exc.got)}")
            self._abort_local(message, tell_peers=True)
            return DistBackendError(message)
        if isinstance(exc, _Timeout):
            self._abort_local(str(exc), tell_peers=True)
            return DistBackendError(str(exc))
        if isinstance(exc, PeerClosedError):
            peer = getattr(exc, "peer", -1)
            return DistBackendError(f"{what} failed: {self._peer_lost_cause(exc, peer)}")
        # Anything else (KeyboardInterrupt, MemoryError, a bug) stopped this rank half way
        # through its frames: the streams are out of step, so the group cannot go on.
        self._abort_local(f"{what} was interrupted on {self._who(self.rank)} by "
                          f"{type(exc).__name__}: {exc}", tell_peers=True)
        return None

    def _collective_done(self) -> None:
        op, seq = self._board.progress[:2]
        self._current = None
        self._board.progress = (op, seq, "finished")

    def _peer_lost_cause(self, exc: PeerClosedError, peer: int) -> str:
        # A reader thread usually explains the loss first (EOF of the dead peer, an ABORT
        # frame); give it a moment, since the connection we were using may only have been
        # shut down because of another peer's death.
        end = time.monotonic() + 0.2
        while self._cause is None and time.monotonic() < end:
            time.sleep(0.005)
        if self._cause is None:
            if peer in self._bye:
                cause = f"{self._who(peer)} closed its process group during this collective"
            else:
                cause = (f"{self._who(peer)} closed its connection: the process exited or was "
                         f"killed ({exc})")
            self._abort_local(cause, tell_peers=True)
        return f"the group was aborted: {self._cause}"

    # -- waiting: stall warning and timeout --------------------------------------------------

    def _slow_wait(self, peers: list[int], waited: float) -> None:
        current = self._current
        if current is None:
            return
        op, seq, deadline, start = current
        now = time.monotonic()
        if self._cause is not None:  # aborted meanwhile (e.g. another rank timed out first)
            raise PeerClosedError("the group was aborted while this rank waited")
        if now >= deadline:
            elapsed = timedelta(seconds=round(now - start))
            report = self._missing_report(seq, peers)
            if self._cause is not None:  # another rank's abort beat ours: report its cause
                raise PeerClosedError("the group was aborted while this rank waited")
            raise _Timeout(f"{self._what(op, seq)} timed out after {elapsed}: {report}")
        if now - start >= _config.STALL_WARNING_S.get() and not self._warned:
            self._warned = True
            log.warning("%s has waited %.0f s: %s", self._what(op, seq), now - start,
                        self._missing_report(seq, peers))

    def _missing_report(self, seq: int, waiting_on: list[int]) -> str:
        """Ask every peer where it is (status frames answered by its reader thread)."""
        assert self._mailbox is not None
        peers = [p for p in range(self.size) if p != self.rank]
        statuses = self._board.query(self._mailbox, peers)
        return missing_report(seq, statuses, peers, waiting_on, self._who)

    # -- plumbing ----------------------------------------------------------------------------

    def _link(self, op: str, dtype: torch.dtype, redop: int, root: int, seq: int,
              total_nbytes: int) -> Any:
        if self._mesh is None:
            return SoloLink(self._scratch)
        return MeshLink(self._mesh, self._scratch, OP_CODES[op], DTYPE_CODES.get(dtype, 0), redop,
                        root, seq, total_nbytes)

    def _choose(self, op: str, nbytes: int) -> tuple[str, int]:
        key = (op, nbytes)
        found = self._choices.get(key)
        if found is None:
            if len(self._choices) > 4096:
                self._choices.clear()
            choice = choose(op, nbytes, self.size, self._same_host, self._overrides)
            found = self._choices[key] = (choice.algorithm, choice.segment_nbytes)
        return found

    def _check_root(self, root: int, op: str) -> None:
        if not 0 <= root < self.size:
            raise ValueError(f"{op}: root {root} is not a rank of a group of size {self.size}")

    def _plan_reduce(self, op: Any, dtype: torch.dtype, opname: str) -> tuple[RedOpType, Any]:
        """(kind, byte reducer) for ``op`` on ``dtype``, checked once per pair.

        Raises:
            ValueError, RuntimeError: the pair has no meaning (reduce_op.check_reduce_op).
        """
        kind = op_type(op)
        reducer = self._reducers.get((kind, dtype))
        if reducer is None:
            check_reduce_op(kind, dtype, opname)
            reducer = self._reducers[(kind, dtype)] = byte_reducer(kind, dtype)
        return kind, reducer

    # -- collectives -------------------------------------------------------------------------

    def all_reduce(self, buf: torch.Tensor, op: Any, seq: int, deadline: float) -> None:
        """See base class."""
        kind, reducer = self._plan_reduce(op, buf.dtype, "all_reduce")
        factor = premul_factor(op)
        with self._collective("all_reduce", seq, deadline):
            if factor is not None:
                buf.mul_(factor)
            data = as_bytes(buf)
            link = self._link("all_reduce", buf.dtype, int(kind), NO_ROOT, seq, data.nbytes)
            algorithm, segment = self._choose("all_reduce", data.nbytes)
            if algorithm == "ring":
                ring.all_reduce(link, data, reducer, buf.element_size(), segment)
            elif algorithm == "scatter_gather":
                direct.all_reduce_scatter_gather(link, data, reducer, buf.element_size(), segment)
            elif algorithm == "recursive_doubling":
                recursive_doubling.all_reduce(link, data, reducer)
            else:
                direct.all_reduce(link, data, reducer)
            if kind is RedOpType.AVG:
                finish_avg(buf, self.size)

    def broadcast(self, buf: torch.Tensor, root: int, seq: int, deadline: float) -> None:
        """See base class."""
        self._check_root(root, "broadcast")
        with self._collective("broadcast", seq, deadline):
            data = as_bytes(buf)
            link = self._link("broadcast", buf.dtype, NO_REDOP, root, seq, data.nbytes)
            algorithm, segment = self._choose("broadcast", data.nbytes)
            if algorithm == "chain":
                tree.broadcast_chain(link, data, root, segment)
            else:
                tree.broadcast_tree(link, data, root)

    def reduce(self, buf: torch.Tensor, op: Any, root: int, seq: int, deadline: float) -> None:
        """See base class."""
        kind, reducer = self._plan_reduce(op, buf.dtype, "reduce")
        self._check_root(root, "reduce")
        factor = premul_factor(op)
        with self._collective("reduce", seq, deadline):
            if factor is not None:
                buf.mul_(factor)
            data = as_bytes(buf)
            algorithm, segment = self._choose("reduce", data.nbytes)
            # direct: only the root reduces, so the root's op is the one applied and the
            # others' op is not compared (seed 003's reduce passes MAX on the root only);
            # the ring reduces on every rank, so there every rank must pass the same op
            redop = NO_REDOP if algorithm == "direct" else int(kind)
            link = self._link("reduce", buf.dtype, redop, root, seq, data.nbytes)
            if algorithm == "ring":
                ring.reduce(link, data, root, reducer, buf.element_size(), segment)
            else:
                direct.reduce(link, data, root, reducer)
            if kind is RedOpType.AVG and self.rank == root:
                finish_avg(buf, self.size)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, seq: int, deadline: float) -> None:
        """See base class."""
        check_sizes("all_gather", out, inp, self.size)
        with self._collective("all_gather", seq, deadline):
            out_bytes, inp_bytes = as_bytes(out), as_bytes(inp)
            link = self._link("all_gather", inp.dtype, NO_REDOP, NO_ROOT, seq, inp_bytes.nbytes)
            algorithm, _ = self._choose("all_gather", out_bytes.nbytes)
            if algorithm == "ring":
                ring.all_gather(link, out_bytes, inp_bytes)
            else:
                direct.all_gather(link, out_bytes, inp_bytes)

    def gather(self, out: torch.Tensor | None, inp: torch.Tensor, root: int, seq: int,
               deadline: float) -> None:
        """See base class."""
        self._check_root(root, "gather")
        check_rooted("gather", self.rank, root, out, inp, self.size)
        with self._collective("gather", seq, deadline):
            inp_bytes = as_bytes(inp)
            link = self._link("gather", inp.dtype, NO_REDOP, root, seq, inp_bytes.nbytes)
            direct.gather(link, None if out is None else as_bytes(out), inp_bytes, root)

    def scatter(self, out: torch.Tensor, inp: torch.Tensor | None, root: int, seq: int,
                deadline: float) -> None:
        """See base class."""
        self._check_root(root, "scatter")
        check_rooted("scatter", self.rank, root, inp, out, self.size)
        with self._collective("scatter", seq, deadline):
            out_bytes = as_bytes(out)
            link = self._link("scatter", out.dtype, NO_REDOP, root, seq, out_bytes.nbytes)
            direct.scatter(link, out_bytes, None if inp is None else as_bytes(inp), root)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: Any, seq: int,
                       deadline: float) -> None:
        """See base class."""
        kind, reducer = self._plan_reduce(op, inp.dtype, "reduce_scatter")
        check_sizes("reduce_scatter", inp, out, self.size)
        factor = premul_factor(op)
        with self._collective("reduce_scatter", seq, deadline):
            if factor is not None:
                inp = inp * factor
            out_bytes, inp_bytes = as_bytes(out), as_bytes(inp)
            link = self._link("reduce_scatter", inp.dtype, int(kind), NO_ROOT, seq,
                              inp_bytes.nbytes)
            algorithm, segment = self._choose("reduce_scatter", inp_bytes.nbytes)
            if algorithm == "ring":
                ring.reduce_scatter(link, out_bytes, inp_bytes, reducer, inp.element_size(),
                                    segment)
            else:
                direct.reduce_scatter(link, out_bytes, inp_bytes, reducer)
            if kind is RedOpType.AVG:
                finish_avg(out, self.size)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                   in_splits: list[int], seq: int, deadline: float) -> None:
        """See base class."""
        check_splits(self.rank, self.size, out, inp, out_splits, in_splits)
        with self._collective("all_to_all", seq, deadline):
            size = inp.element_size()
            out_offsets = [0, *np.cumsum(out_splits).tolist()]
            in_offsets = [0, *np.cumsum(in_splits).tolist()]
            link = self._link("all_to_all", inp.dtype, NO_REDOP, NO_ROOT, seq, 0)
            direct.all_to_all(link, as_bytes(out), as_bytes(inp),
                              [o * size for o in out_offsets], [o * size for o in in_offsets])

    def barrier(self, seq: int, deadline: float) -> None:
        """See base class."""
        with self._collective("barrier", seq, deadline):
            recursive_doubling.barrier(self._link("barrier", torch.uint8, NO_REDOP, NO_ROOT, seq, 0))

    # -- point to point ------------------------------------------------------------------------

    def send(self, buf: torch.Tensor, dst: int, tag: int, deadline: float) -> None:
        """See base class."""
        what = f"send to rank {dst} (tag {tag}) on group '{self.ctx.group_name}'"
        check_peer(self.rank, self.size, dst, what)
        self._check_usable(what)
        assert self._mailbox is not None
        try:
            self._mailbox.send(dst, tag, as_bytes(buf), deadline)
        except DeadlineExceeded:
            cause = f"{what} timed out: {self._who(dst)} does not read its messages"
            self._abort_local(cause, tell_peers=True)
            raise DistBackendError(cause) from None
        except PeerClosedError as exc:
            raise DistBackendError(f"{what} failed: {self._peer_lost_cause(exc, dst)}") from None

    def recv(self, buf: torch.Tensor, src: int | None, tag: int, deadline: float) -> int:
        """See base class."""
        source = "any rank" if src is None else f"rank {src}"
        what = f"recv from {source} (tag {tag}) on group '{self.ctx.group_name}'"
        if src is not None:
            check_peer(self.rank, self.size, src, what)
        self._check_usable(what)
        if self._mailbox is None:
            raise ValueError(f"{what}: a group of one rank has nobody to receive from")
        try:
            return self._mailbox.recv(as_bytes(buf), src, tag, deadline)
        except mb.RecvError as exc:
            error = exc.args[0]
            if isinstance(error, PeerClosedError) and src is not None:
                raise DistBackendError(f"{what} failed: {self._peer_lost_cause(error, src)}") \
                    from None
            if isinstance(error, PeerClosedError) and self._cause is not None:
                raise DistBackendError(f"{what} failed: the group was aborted: {self._cause}") \
                    from None
            raise DistBackendError(f"{what} failed: {error}") from None
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


__all__ = ["NativeBackend"]

"""The MPI backend: each operation of a group handed to MPI through mpi4py's buffer methods.

Rules it keeps (docs/mpi.md numbers them):
1. MPI is initialised once per process, by ``mpi_env.init_mpi()``, and its threading level is
   checked there; every MPI call below runs under ``mpi_env.call_lock()`` (a no-op with
   MPI_THREAD_MULTIPLE, torch's global lock with MPI_THREAD_SERIALIZED).
2. One communicator per group, made when the group is: the default group gets a duplicate of
   MPI_COMM_WORLD, a subgroup a communicator made from the world group's ranks it lists
   (``Comm.Create_group``, collective over the members only). Communicator rank = group rank.
3. Bytes go to MPI straight from the tensor's memory, a NumPy view of it with the MPI datatype
   that matches; nothing is pickled or copied (PREMUL_SUM scales a copy when the input must be
   left alone). Moving operations (broadcast, gathers, scatter, all_to_all, send/recv) use
   MPI_BYTE and so take every dtype; reductions use typed buffers and MPI's ops, and for
   float16, bfloat16 and complex32, which MPI has no type for, an MPI user op that reduces with
   torch's kernels (``reduce_op.byte_reducer``).
4. Before each collective the ranks compare (sequence number, collective, op, dtype, bytes,
   root) with one small MPI_Allgather, unless RINGTORCH_MPI_CHECK=0: a mismatch raises
   DistBackendError on every rank naming what each rank called, where MPI would hang or
   compute garbage.
5. MPI's errors come back as DistBackendError (the communicator returns errors instead of
   aborting). A rank that dies makes the MPI launcher end the whole job.
6. Deadlines: send and recv are nonblocking MPI calls polled until done or until ``deadline``
   (a receive that times out is cancelled, the group stays usable). Collectives are MPI's
   blocking calls, which are 2-4x faster here than its nonblocking twins and cannot time out
   (as in torch's ProcessGroupMPI); under MPI_THREAD_SERIALIZED they are the nonblocking twins,
   polled, so that a waiting group never holds the process-wide lock, and then they do time
   out (leaving the backend aborted: MPI cannot take a collective back).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import torch

from ringtorch._buffers import address, as_bytes
from ringtorch._config import MPI_CHECK
from ringtorch._errors import DistBackendError
from ringtorch._observe.operation import Operation
from ringtorch.collectives.backends import mpi_env
from ringtorch.collectives.backends.base import Backend, BackendContext
from ringtorch.collectives.call import (
    AGREEMENT,
    CallMaker,
    Signature,
    agreement_fields,
    from_agreement,
    new_call,
)
from ringtorch.collectives.lowering import Lowering, lower, scale
from ringtorch.collectives.reduce_op import (
    RedOpType,
    byte_reducer,
    op_type,
    premul_factor,
)
from ringtorch.collectives.reports import disagreement

# torch dtype -> the MPI datatype (by name) of reductions MPI computes itself.
_MPI_TYPES: dict[torch.dtype, str] = {
    torch.float32: "FLOAT", torch.float64: "DOUBLE", torch.int8: "INT8_T", torch.uint8: "UINT8_T",
    torch.int16: "INT16_T", torch.int32: "INT32_T", torch.int64: "INT64_T",
    torch.uint16: "UINT16_T", torch.uint32: "UINT32_T", torch.uint64: "UINT64_T",
    torch.bool: "C_BOOL", torch.complex64: "C_FLOAT_COMPLEX", torch.complex128: "C_DOUBLE_COMPLEX",
}
# Dtypes MPI has no type for: reduced by a user op on same-sized unsigned words.
_USER_OP_TYPES: dict[torch.dtype, str] = {
    torch.float16: "UINT16_T", torch.bfloat16: "UINT16_T", torch.complex32: "UINT32_T",
}
_MPI_OPS = {
    RedOpType.SUM: "SUM", RedOpType.AVG: "SUM", RedOpType.PREMUL_SUM: "SUM",
    RedOpType.PRODUCT: "PROD", RedOpType.MIN: "MIN", RedOpType.MAX: "MAX",
    RedOpType.BAND: "BAND", RedOpType.BOR: "BOR", RedOpType.BXOR: "BXOR",
}
# MPI allows only logical ops on C_BOOL; these give torch's bool results (sum = or, ...).
_BOOL_OPS = {
    RedOpType.SUM: "LOR", RedOpType.PRODUCT: "LAND", RedOpType.MIN: "LAND",
    RedOpType.MAX: "LOR", RedOpType.BAND: "LAND", RedOpType.BOR: "LOR", RedOpType.BXOR: "LXOR",
}


# Every subgroup is made with this tag: MPI matches Create_group calls on COMM_WORLD in the
# order the members make them, which is new_group's order (every rank calls it in the same
# order). A tag from the group's name would not do: torch's hashed names for
# use_local_synchronization differ between ranks whose histories differ.
_CREATE_GROUP_TAG = 0x5247

_SPIN_SECONDS = 100e-6  # a wait polls flat out this long, then sleeps between polls

_user_ops: dict[tuple[RedOpType, torch.dtype], Any] = {}


def _user_op(MPI: Any, kind: RedOpType, dtype: torch.dtype) -> Any:
    """The MPI user op reducing ``dtype`` with torch's kernel (made once, kept for the process)."""
    key = (kind, dtype)
    if key not in _user_ops:
        reducer = byte_reducer(kind, dtype)

        def reduce_words(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
            # MPI's contract: inoutbuf = inbuf (op) inoutbuf.
            reducer(np.frombuffer(inoutbuf, np.uint8), np.frombuffer(inbuf, np.uint8), True)

        _user_ops[key] = MPI.Op.Create(reduce_words, commute=True)
    return _user_ops[key]



class MpiBackend(Backend):
    """One group's operations on its own MPI communicator. See base class."""

    def __init__(self, ctx: BackendContext) -> None:
        super().__init__(ctx)
        self._mpi = mpi_env.init_mpi()
        self._lock = mpi_env.call_lock()
        self._serialized = mpi_env.thread_level_name() != "MPI_THREAD_MULTIPLE"
        self._failed: str | None = None
        with self._lock:
            self._comm = self._make_comm()
        self._check = MPI_CHECK.get() and ctx.size > 1
        self._records = bytearray(AGREEMENT.size * ctx.size)
        self._calls = CallMaker(ctx.group_name)
        self._agreements: dict[tuple[Any, ...], tuple[Signature, tuple[int, int, int, int]]] = {}
        self._reductions: dict[tuple[RedOpType, torch.dtype, str], tuple[Any, Any, Lowering]] = {}

    # -- set-up ---------------------------------------------------------------------------

    def _make_comm(self) -> Any:
        """The group's communicator: a duplicate of COMM_WORLD for a group of every rank, else
        one made from the world ranks ``ctx.global_ranks`` lists, in that order."""
        MPI, ctx = self._mpi, self.ctx
        world = MPI.COMM_WORLD
        world_rank, world_size = world.Get_rank(), world.Get_size()
        ranks = list(ctx.global_ranks)
        if len(ranks) != ctx.size or ranks[ctx.rank] != world_rank or max(ranks) >= world_size:
            raise DistBackendError(
                f"MPI backend for group '{ctx.group_name}': the group's ranks {ranks} (this "
                f"process is group rank {ctx.rank}) do not match MPI_COMM_WORLD, where this "
                f"process is rank {world_rank} of {world_size}: start the job with mpirun and "
                f"let init_process_group('mpi') take the ranks from MPI")
        if ranks == list(range(world_size)):
            comm = world.Dup()
        else:
            world_group = world.Get_group()
            group = world_group.Incl(ranks)
            comm = world.Create_group(group, _CREATE_GROUP_TAG)
            group.Free()
            world_group.Free()
        comm.Set_errhandler(MPI.ERRORS_RETURN)
        comm.Set_name(f"ringtorch:{ctx.group_name}")
        assert comm.Get_rank() == ctx.rank and comm.Get_size() == ctx.size
        return comm

    # -- the checks every operation makes -------------------------------------------------

    def _enter(self, name: str) -> None:
        if self._comm is None:
            raise DistBackendError(f"{name} on group '{self.ctx.group_name}': the MPI backend "
                                   f"is closed")
        if self._failed is not None:
            raise DistBackendError(f"{name} on group '{self.ctx.group_name}': the MPI backend "
                                   f"was aborted: {self._failed}")

    def _mpi_call(self, name: str, fn: Any, *args: Any) -> Any:
        """One MPI call under the call lock, MPI's errors turned into DistBackendError."""
        try:
            with self._lock:
                return fn(*args)
        except self._mpi.Exception as exc:
            # MPICH appends a call stack after the first line; the first line says what.
            what = exc.Get_error_string().splitlines()[0].removesuffix(", error stack:")
            raise DistBackendError(f"{name} on group '{self.ctx.group_name}' failed in MPI: "
                                   f"{what}") from exc

    def _collective(self, name: str, deadline: float, method: str, *args: Any) -> None:
        """Rule 6: MPI's blocking collective with MPI_THREAD_MULTIPLE (the fast one); with
        SERIALIZED its nonblocking twin, polled, so that no group sits on the lock."""
        if not self._serialized:
            self._mpi_call(name, getattr(self._comm, method), *args)
            return
        request = self._mpi_call(name, getattr(self._comm, "I" + method[0].lower() + method[1:]), *args)
        self._wait(name, request, None, deadline, cancellable=False)

    def _wait(self, what: str, request: Any, status: Any, deadline: float,
              cancellable: bool) -> None:
        """Poll ``request`` until it completes: spin first, then sleep up to 1 ms a round.

        Raises:
            DistBackendError: ``deadline`` passed. A receive is cancelled and the group stays
                usable; anything MPI cannot cancel leaves the backend aborted.
        """
        start = time.monotonic()
        pause = 0.0
        while not self._mpi_call(what, request.Test, status):
            now = time.monotonic()
            if now >= deadline:
                self._give_up(what, request, status, now - start, cancellable)
                return
            if now - start > _SPIN_SECONDS:
                time.sleep(pause)
                pause = min(max(pause * 2, 1e-5), 1e-3)

    def _give_up(self, what: str, request: Any, status: Any, elapsed: float,
                 cancellable: bool) -> None:
        # ringtorch's words, then torch's gloo phrase, which users' checks look for
        message = (f"{what} on group '{self.ctx.group_name}' timed out after {elapsed:.1f} s "
                   f"(Timed out waiting {round(elapsed * 1000)}ms)")
        if cancellable:
            self._mpi_call(what, request.Cancel)
            give_up_at = time.monotonic() + 1.0
            while time.monotonic() < give_up_at:
                if self._mpi_call(what, request.Test, status):
                    if status is None or not status.Is_cancelled():
                        return  # the message arrived while we cancelled: it is delivered
                    raise DistBackendError(message)
                time.sleep(1e-3)
        self._failed = (f"{message}, and MPI cannot take the operation back, so the group "
                        f"cannot be used any more")
        raise DistBackendError(self._failed)

    def _agree(self, name: str, o: Operation, redop: RedOpType | None = None,
               dtype: torch.dtype | None = None, nbytes: int = -1, root: int = -1) -> None:
        """Rule 4: every rank is at the same collective with the same arguments, or all raise
        (the fields left out are not compared). Attaches the call to the operation."""
        self._enter(name)
        key = (name, dtype, redop, root)
        found = self._agreements.get(key)
        if found is None:  # the call's signature and its record's fields, once per key
            sig = self._calls.signature(name, dtype, redop, root)
            found = self._agreements[key] = (sig, agreement_fields(sig))
        sig, (kind, red, code, root) = found
        seq, deadline = o.seq, o.deadline
        call = o.call = new_call(sig, seq, nbytes, deadline)
        o.route = self
        if not self._check:
            return
        record = AGREEMENT.pack(seq, kind, red, code, nbytes, root)  # call.agreement_record
        self._collective(name, deadline, "Allgather", [record, self._mpi.BYTE],
                         [self._records, self._mpi.BYTE])
        if self._records != record * self.size:
            raise DistBackendError(disagreement(call, from_agreement(bytes(self._records),
                                                                     call.group)))

    def _reduction(self, name: str, op: Any, dtype: torch.dtype) -> tuple[Any, Any, Lowering]:
        """(MPI datatype, MPI op, lowering) for reducing ``dtype`` with ``op``: MPI applies
        the base op; PREMUL_SUM's scaling and AVG's division are the lowering's."""
        kind = op if type(op) is RedOpType else op_type(op)
        found = self._reductions.get((kind, dtype, name))
        if found is None:  # checked and lowered once per (op, dtype, collective)
            found = self._reductions[(kind, dtype, name)] = self._reduction_of(name, kind, dtype)
        return found

    def _reduction_of(self, name: str, kind: RedOpType,
                      dtype: torch.dtype) -> tuple[Any, Any, Lowering]:
        MPI = self._mpi
        low = lower(kind, dtype, name, self.size)
        if dtype in _MPI_TYPES:
            ops = _BOOL_OPS if dtype is torch.bool else _MPI_OPS
            return getattr(MPI, _MPI_TYPES[dtype]), getattr(MPI, ops[low.base]), low
        if dtype in _USER_OP_TYPES:
            return getattr(MPI, _USER_OP_TYPES[dtype]), _user_op(MPI, low.base, dtype), low
        raise TypeError(f"{name}: the MPI backend cannot reduce dtype {dtype} with {kind.name}")

    def _typed(self, tensor: torch.Tensor, mpi_type: Any) -> list[Any]:
        """[the tensor's memory, its MPI datatype]: what mpi4py's buffer methods take."""
        return [self._memory(tensor), mpi_type]

    def _bytes(self, tensor: torch.Tensor) -> list[Any]:
        return [self._memory(tensor), self._mpi.BYTE]

    def _memory(self, tensor: torch.Tensor) -> Any:
        """The tensor's own bytes as an mpi4py buffer (no copy, no NumPy round trip: 0.2 µs
        where ``tensor.view(torch.uint8).numpy()`` costs 1.5-3 µs). The caller keeps the
        tensor alive until MPI is done with it: every operation here completes before it
        returns."""
        return self._mpi.buffer.fromaddress(*address(tensor))

    # -- collectives ----------------------------------------------------------------------

    def broadcast(self, buf: torch.Tensor, root: int, o: Operation) -> None:
        """See base class."""
        self._agree("broadcast", o, nbytes=buf.nbytes, root=root)
        self._collective("broadcast", o.deadline, "Bcast", self._bytes(buf), root)

    def all_reduce(self, buf: torch.Tensor, op: Any, o: Operation) -> None:
        """See base class."""
        types, mpi_op, low = self._reduction("all_reduce", op, buf.dtype)
        self._agree("all_reduce", o, low.kind, buf.dtype, buf.nbytes)
        if low.scales:
            _premultiply(buf, op, low)
        self._collective("all_reduce", o.deadline, "Allreduce", self._mpi.IN_PLACE,
                         self._typed(buf, types), mpi_op)
        if low.post is not None:
            _post(buf, low)

    def reduce(self, buf: torch.Tensor, op: Any, root: int, o: Operation) -> None:
        """See base class."""
        types, mpi_op, low = self._reduction("reduce", op, buf.dtype)
        self._agree("reduce", o, low.kind, buf.dtype, buf.nbytes, root)
        if self.rank == root:
            _premultiply(buf, op, low)
            self._collective("reduce", o.deadline, "Reduce", self._mpi.IN_PLACE,
                             self._typed(buf, types), mpi_op, root)
            _post(buf, low)
        else:
            send = _premultiplied_copy(buf, op, low)
            self._collective("reduce", o.deadline, "Reduce", self._typed(send, types), None, mpi_op,
                             root)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, o: Operation) -> None:
        """See base class."""
        self._agree("all_gather", o, nbytes=inp.nbytes)
        self._collective("all_gather", o.deadline, "Allgather", self._bytes(inp), self._bytes(out))

    def gather(self, out: torch.Tensor | None, inp: torch.Tensor, root: int,
               o: Operation) -> None:
        """See base class."""
        self._agree("gather", o, nbytes=inp.nbytes, root=root)
        recv = self._bytes(out) if self.rank == root and out is not None else None
        self._collective("gather", o.deadline, "Gather", self._bytes(inp), recv, root)

    def scatter(self, out: torch.Tensor, inp: torch.Tensor | None, root: int,
                o: Operation) -> None:
        """See base class."""
        self._agree("scatter", o, nbytes=out.nbytes, root=root)
        send = self._bytes(inp) if self.rank == root and inp is not None else None
        self._collective("scatter", o.deadline, "Scatter", send, self._bytes(out), root)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: Any,
                       o: Operation) -> None:
        """See base class."""
        types, mpi_op, low = self._reduction("reduce_scatter", op, inp.dtype)
        self._agree("reduce_scatter", o, low.kind, inp.dtype, out.nbytes)
        send = _premultiplied_copy(inp, op, low)
        self._collective("reduce_scatter", o.deadline, "Reduce_scatter_block",
                         self._typed(send, types), self._typed(out, types), mpi_op)
        _post(out, low)

    def all_to_all(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
                   in_splits: list[int], o: Operation) -> None:
        """See base class."""
        self._agree("all_to_all", o)
        send = _counted(self._bytes(inp), in_splits, inp.element_size())
        recv = _counted(self._bytes(out), out_splits, out.element_size())
        self._collective("all_to_all", o.deadline, "Alltoallv", send, recv)

    def barrier(self, o: Operation) -> None:
        """See base class."""
        self._agree("barrier", o)
        self._collective("barrier", o.deadline, "Barrier")

    # -- point to point -------------------------------------------------------------------

    def _check_tag(self, name: str, tag: int) -> None:
        tag_ub = self._comm.Get_attr(self._mpi.TAG_UB)
        if not 0 <= tag <= tag_ub:
            raise ValueError(f"{name}: tag {tag} is out of range for the MPI backend: MPI "
                             f"tags go from 0 to {tag_ub}")

    def send(self, buf: torch.Tensor, dst: int, tag: int, deadline: float) -> None:
        """See base class."""
        self._enter("send")
        self._check_tag("send", tag)
        request = self._mpi_call("send", self._comm.Isend, self._bytes(buf), dst, tag)
        self._wait(f"send to rank {dst} (tag {tag})", request, None, deadline, cancellable=False)

    def recv(self, buf: torch.Tensor, src: int | None, tag: int, deadline: float) -> int:
        """See base class."""
        self._enter("recv")
        self._check_tag("recv", tag)
        MPI = self._mpi
        status = MPI.Status()
        source = MPI.ANY_SOURCE if src is None else src
        request = self._mpi_call("recv", self._comm.Irecv, self._bytes(buf), source, tag)
        what = f"recv from rank {'any' if src is None else src} (tag {tag})"
        self._wait(what, request, status, deadline, cancellable=True)
        sender, got = status.Get_source(), status.Get_count(MPI.BYTE)
        if got != buf.nbytes:
            raise DistBackendError(
                f"recv on group '{self.ctx.group_name}' from rank {sender} (tag {tag}): "
                f"expected {buf.nbytes} bytes, the message had {got}")
        return sender

    # -- ending ---------------------------------------------------------------------------

    def route(self, record: Any) -> tuple[str, str]:
        """See base class: MPI chooses its own algorithm and does not say which."""
        return "mpi", "the MPI library's"

    def abort(self, reason: str) -> None:
        """See base class. MPI cannot cancel a call in progress nor tell the peers anything
        short of ending the job, so, as torch's ProcessGroupMPI does, this calls MPI_Abort on
        the group's communicator: the launcher then stops every rank of the job."""
        self._failed = reason
        if self._comm is not None:
            print(f"ringtorch: the MPI backend of group '{self.ctx.group_name}' aborts the MPI "
                  f"job: {reason}", file=sys.stderr, flush=True)
            self._comm.Abort(1)

    def close(self) -> None:
        """See base class."""
        comm, self._comm = self._comm, None
        if comm is not None and not self._mpi.Is_finalized():
            with self._lock:
                comm.Free()


def _post(buf: torch.Tensor, low: Lowering) -> None:
    """The lowering's step after the reduction (AVG's division), if any."""
    if low.post is not None and buf.numel():
        low.post(as_bytes(buf))


def _premultiply(buf: torch.Tensor, op: Any, low: Lowering) -> None:
    if low.scales and buf.numel():
        scale(buf, premul_factor(op), in_place=True)


def _premultiplied_copy(buf: torch.Tensor, op: Any, low: Lowering) -> torch.Tensor:
    """``buf`` itself, or for PREMUL_SUM a scaled copy (the caller's input stays as it was)."""
    if not low.scales:
        return buf
    return scale(buf, premul_factor(op), in_place=False)


def _counted(spec: list[Any], splits: list[int], itemsize: int) -> list[Any]:
    """An Alltoallv buffer spec: [bytes, (byte counts, byte displacements), MPI.BYTE]."""
    counts = [n * itemsize for n in splits]
    displs = np.concatenate(([0], np.cumsum(counts[:-1], dtype=np.int64))).tolist()
    return [spec[0], (counts, displs), spec[1]]


__all__ = ["MpiBackend"]

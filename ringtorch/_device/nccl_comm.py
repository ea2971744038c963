"""NCCL as backend "nccl" sees it: a library that makes communicators, and a communicator
whose every operation is enqueued on a stream and returns at once.

Two implementations keep this contract: :class:`RealNccl` over the ctypes binding
(``nccl_lib``), and a fake (``ringtorch.distributed._nccl_fake``) that runs ringtorch's CPU
collectives on the simulated runtime's streams, for tests on machines without a GPU. The
docstrings below are the contract. Rules kept: an operation never blocks the host (it is
work on ``stream``, in that stream's order); a communicator's failure is learnt by polling
:meth:`Communicator.async_error`, never by a call that may hang; :meth:`Communicator.abort`
is safe from any thread, on a communicator that is initialising, working or hung.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import torch

from ringtorch import _config
from ringtorch._device import nccl_lib
from ringtorch._device.confirmed import confirmed

SUCCESS = 0
IN_PROGRESS = nccl_lib.IN_PROGRESS
REMOTE_ERROR = 6  # ncclRemoteError: a peer died or the network failed
_ENQUEUE_S = 60.0  # how long a non-blocking communicator may take to accept one call
# ReduceOp names (ringtorch's and torch's) -> ncclRedOp_t
REDUCE_OPS = {"SUM": nccl_lib.SUM, "PRODUCT": nccl_lib.PROD, "MAX": nccl_lib.MAX,
              "MIN": nccl_lib.MIN, "AVG": nccl_lib.AVG}


FEATURE = "nccl_backend"


def is_open() -> bool:
    """Whether backend "nccl" is open: confirmed by a recorded GPU run (``confirmed.py``), or
    opened for tests and the GPU check (``RINGTORCH_DEVICE_UNCONFIRMED=1``)."""
    return bool(_config.DEVICE_UNCONFIRMED.get()) or confirmed(FEATURE)


def why_unusable() -> str | None:
    """What this machine lacks for backend "nccl" once it is open (None: nothing). The fake
    (``RINGTORCH_NCCL_FAKE``, tests only) needs nothing."""
    if _config.NCCL_FAKE.get():
        return None
    if not torch.cuda.is_available():
        return ("the NCCL backend needs a CUDA GPU, and torch sees none. Use backend='gloo' "
                "(ringtorch's native CPU backend).")
    if nccl_lib.locate() is None:
        return ("the NCCL backend needs the NCCL library (the nvidia-nccl wheel torch's CUDA "
                "build depends on, or RINGTORCH_NCCL_LIBRARY), and none was found.")
    return None


class Communicator(Protocol):
    """One rank's member of an NCCL communicator. Buffers are device tensors, contiguous;
    counts are their numel. Each operation enqueues on ``stream`` and returns before it runs;
    the caller keeps the tensors alive until an event recorded after it completes."""

    rank: int
    nranks: int

    def async_error(self) -> int:
        """ncclCommGetAsyncError: 0 (fine), IN_PROGRESS (still initialising) or the error."""

    def error_text(self) -> str:
        """What the library says about the last error (may be empty)."""

    def abort(self) -> None:
        """Stop every operation, pending or running, and free the communicator."""

    def destroy(self) -> None:
        """Free the communicator once its work is done (never on a hung one: abort)."""

    def all_reduce(self, send: torch.Tensor, recv: torch.Tensor, op: int, stream: Any) -> None:
        """``recv`` = reduction of every rank's ``send`` (``send`` may be ``recv``)."""

    def broadcast(self, send: torch.Tensor, recv: torch.Tensor, root: int, stream: Any) -> None:
        """Every rank's ``recv`` = root's ``send``."""

    def reduce(self, send: torch.Tensor, recv: torch.Tensor, op: int, root: int,
               stream: Any) -> None:
        """Root's ``recv`` = reduction of every rank's ``send``."""

    def all_gather(self, send: torch.Tensor, recv: torch.Tensor, stream: Any) -> None:
        """``recv`` (nranks * send.numel()) = every rank's ``send`` in rank order."""

    def reduce_scatter(self, send: torch.Tensor, recv: torch.Tensor, op: int,
                       stream: Any) -> None:
        """Rank r's ``recv`` = reduction over ranks of slice r of ``send``."""

    def send(self, buf: torch.Tensor, peer: int, stream: Any) -> None:
        """Send ``buf`` to ``peer`` (matched by its recv, in order)."""

    def recv(self, buf: torch.Tensor, peer: int, stream: Any) -> None:
        """Receive ``peer``'s next send into ``buf``."""

    def group_start(self) -> None:
        """Begin a group: the sends and recvs until :meth:`group_end` progress together."""

    def group_end(self) -> None:
        """End the group started by :meth:`group_start` (enqueues its work)."""


class Library(Protocol):
    """What makes communicators."""

    def version(self) -> int:
        """ncclGetVersion's code (23203 for 2.32.3)."""

    def unique_id(self) -> bytes:
        """128 fresh bytes naming a new communicator (made by one rank, sent to the others)."""

    def init_rank(self, nranks: int, unique_id: bytes, rank: int, device: int) -> Communicator:
        """Start joining the communicator ``unique_id`` as ``rank`` on GPU ``device``, without
        blocking: ``async_error()`` is IN_PROGRESS until every rank has joined."""


def _dtype(t: torch.Tensor) -> tuple[int, int]:
    """(ncclDataType_t, element count) of a tensor (bool as uint8, complex as its floats)."""
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        return nccl_lib.DATATYPES["uint8"], t.numel()
    name = str(t.dtype).split(".")[-1]
    if name not in nccl_lib.DATATYPES:
        raise TypeError(f"NCCL has no data type for {t.dtype}")
    return nccl_lib.DATATYPES[name], t.numel()


class RealComm:
    """:class:`Communicator` over the bound library (see the base class)."""

    def __init__(self, lib: nccl_lib.Nccl, comm: int, rank: int, nranks: int) -> None:
        self._lib = lib
        self._comm = comm
        self.rank = rank
        self.nranks = nranks

    def _enqueue(self, name: str, **arguments: Any) -> None:
        self._settled(name, self._lib.raw(name, comm=self._comm, **arguments))

    def _settled(self, name: str, code: int) -> None:
        """Raise unless ``code`` is success; a non-blocking communicator may answer
        ncclInProgress (the call goes on in the background), and NCCL asks that nothing
        else be called on it until ncclCommGetAsyncError no longer says so."""
        deadline = time.monotonic() + _ENQUEUE_S
        while code == IN_PROGRESS and time.monotonic() < deadline:
            time.sleep(0.0001)
            code = self._lib.async_error(self._comm)
        if code != SUCCESS:
            raise nccl_lib.NcclError(f"{name} failed: {self._lib.error_string(code)} "
                                     f"(ncclResult_t {code}){self._lib._last_error(self._comm)}",
                                     code)

    def async_error(self) -> int:
        return self._lib.async_error(self._comm)

    def error_text(self) -> str:
        text = self._lib.raw("ncclGetLastError", comm=self._comm)
        return text.decode(errors="replace") if text else ""

    def abort(self) -> None:
        self._lib.comm_abort(self._comm)

    def destroy(self) -> None:
        self._settled("ncclCommDestroy", self._lib.raw("ncclCommDestroy", comm=self._comm))

    def all_reduce(self, send: torch.Tensor, recv: torch.Tensor, op: int, stream: Any) -> None:
        dtype, count = _dtype(send)
        self._enqueue("ncclAllReduce", sendbuff=send.data_ptr(), recvbuff=recv.data_ptr(),
                      count=count, datatype=dtype, op=op, stream=stream.cuda_stream)

    def broadcast(self, send: torch.Tensor, recv: torch.Tensor, root: int, stream: Any) -> None:
        dtype, count = _dtype(send)
        self._enqueue("ncclBroadcast", sendbuff=send.data_ptr(), recvbuff=recv.data_ptr(),
                      count=count, datatype=dtype, root=root, stream=stream.cuda_stream)

    def reduce(self, send: torch.Tensor, recv: torch.Tensor, op: int, root: int,
               stream: Any) -> None:
        dtype, count = _dtype(send)
        self._enqueue("ncclReduce", sendbuff=send.data_ptr(), recvbuff=recv.data_ptr(),
                      count=count, datatype=dtype, op=op, root=root, stream=stream.cuda_stream)

    def all_gather(self, send: torch.Tensor, recv: torch.Tensor, stream: Any) -> None:
        dtype, count = _dtype(send)
        self._enqueue("ncclAllGather", sendbuff=send.data_ptr(), recvbuff=recv.data_ptr(),
                      sendcount=count, datatype=dtype, stream=stream.cuda_stream)

    def reduce_scatter(self, send: torch.Tensor, recv: torch.Tensor, op: int,
                       stream: Any) -> None:
        dtype, count = _dtype(recv)
        self._enqueue("ncclReduceScatter", sendbuff=send.data_ptr(), recvbuff=recv.data_ptr(),
                      recvcount=count, datatype=dtype, op=op, stream=stream.cuda_stream)

    def send(self, buf: torch.Tensor, peer: int, stream: Any) -> None:
        dtype, count = _dtype(buf)
        self._enqueue("ncclSend", sendbuff=buf.data_ptr(), count=count, datatype=dtype,
                      peer=peer, stream=stream.cuda_stream)

    def recv(self, buf: torch.Tensor, peer: int, stream: Any) -> None:
        dtype, count = _dtype(buf)
        self._enqueue("ncclRecv", recvbuff=buf.data_ptr(), count=count, datatype=dtype,
                      peer=peer, stream=stream.cuda_stream)

    def group_start(self) -> None:
        self._lib.group_start()

    def group_end(self) -> None:
        self._settled("ncclGroupEnd", self._lib.raw("ncclGroupEnd"))


class RealNccl:
    """:class:`Library` over the NCCL library found by ``nccl_lib.load()``."""

    def __init__(self, lib: nccl_lib.Nccl | None = None) -> None:
        self._lib = lib if lib is not None else nccl_lib.load()

    def version(self) -> int:
        return self._lib.version()

    def unique_id(self) -> bytes:
        return self._lib.unique_id()

    def init_rank(self, nranks: int, unique_id: bytes, rank: int, device: int) -> RealComm:
        with torch.cuda.device(device):  # NCCL binds the communicator to the current device
            comm = self._lib.comm_init_rank_nonblocking(nranks, unique_id, rank)
        return RealComm(self._lib, comm, rank, nranks)

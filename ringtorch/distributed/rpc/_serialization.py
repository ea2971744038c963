"""Pickle protocol 5 for RPC messages, with tensor and array bytes out of band.

A tensor is never pickled in band: its reducer hands pickle a ``PickleBuffer`` over the
tensor's own bytes (a contiguous CPU tensor of any dtype, bfloat16 and bool included), which
``buffer_callback`` collects; the sender writes those buffers straight from the tensor's memory
and the receiver reads them into fresh arrays that become the new tensors' storage. NumPy
arrays go out of band through their own protocol-5 support. Sparse COO tensors travel as their
index and value tensors. Other layouts, and tensors that are not on the CPU, are refused with
a clear error.

Other modules plug their own types in with ``register_reducer`` (rref.py does, for RRefs);
their reducers see the message being built through ``encode_context()`` (destination, objects
to keep alive until the peer has the message) and rebuild functions see the message being
loaded through ``decode_context()`` (source worker).

Tensors become memory, and memory tensors, through ringtorch/_buffers.py (the one place that
does so).
"""

from __future__ import annotations

import copyreg
import io
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ringtorch import _buffers
from ringtorch._device import place
from ringtorch.distributed.rpc import _devices
from ringtorch.distributed.rpc._state import STATE, PerThread

_CUDA_MESSAGE = (
    "TensorPipe RPC backend only supports CPU tensors by default, please move your tensors "
    "to CPU before sending them over RPC (ringtorch's RPC agent moves CPU tensors only)"
)


class EncodeContext:
    """What reducers may read and extend while one message is pickled: its destination,
    objects to keep alive until the peer has loaded it, the tensors met, and what to undo if
    pickling fails."""

    __slots__ = ("dst", "holds", "rollback", "tensors")

    def __init__(self, dst: int) -> None:
        self.dst = dst
        self.holds: list[Any] = []
        self.tensors: list[torch.Tensor] = []
        self.rollback: list[Callable[[], None]] = []


class DecodeContext:
    """What rebuild functions may read while one message is loaded."""

    __slots__ = ("on_tensor", "src", "tensors")

    def __init__(self, src: int,
                 on_tensor: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.src = src
        self.on_tensor = on_tensor
        self.tensors: list[torch.Tensor] = []


class Encoded:
    """One pickled message: bytes, out-of-band buffers, objects to keep alive, tensors seen."""

    __slots__ = ("buffers", "data", "holds", "tensors")

    def __init__(self, data: bytes, buffers: list[memoryview], holds: list[Any],
                 tensors: list[torch.Tensor]) -> None:
        self.data = data
        self.buffers = buffers
        self.holds = holds
        self.tensors = tensors


def encode_context() -> EncodeContext:
    """The message being pickled on this thread.

    Raises:
        RuntimeError: nothing is being pickled for RPC on this thread.
    """
    ctx: EncodeContext | None = STATE.thread.encode
    if ctx is None:
        raise RuntimeError("no RPC message is being pickled on this thread")
    return ctx


def decode_context() -> DecodeContext:
    """The message being loaded on this thread (see ``encode_context``)."""
    ctx: DecodeContext | None = STATE.thread.decode
    if ctx is None:
        raise RuntimeError("no RPC message is being loaded on this thread")
    return ctx


def _rebuild_tensor(dtype: torch.dtype, shape: tuple[int, ...], requires_grad: bool,
                    buf: Any) -> torch.Tensor:
    tensor = _buffers.tensor_from_bytes(buf, dtype, shape)
    if requires_grad:
        tensor.requires_grad_(True)
    ctx: DecodeContext | None = STATE.thread.decode
    if ctx is not None:
        if ctx.on_tensor is not None:
            tensor = ctx.on_tensor(tensor)
        ctx.tensors.append(tensor)
    return tensor


def _rebuild_sparse_coo(indices: torch.Tensor, values: torch.Tensor, size: tuple[int, ...],
                        coalesced: bool, requires_grad: bool) -> torch.Tensor:
    tensor = torch.sparse_coo_tensor(indices, values, size, is_coalesced=coalesced,
                                     check_invariants=True)
    return tensor.requires_grad_(requires_grad)


def _reduce_tensor(tensor: torch.Tensor) -> tuple[Any, ...]:
    ctx: EncodeContext | None = STATE.thread.encode
    if ctx is not None and (index := _devices.device_index(tensor)) is not None \
            and place.training_opened():
        # a device tensor: staged through host memory to the mapped device (_devices.py)
        target = _devices.target(index, ctx.dst)
        return (_devices.rebuild_on_device,
                (target, tensor.requires_grad, _devices.to_host(tensor)))
    if tensor.device.type != "cpu":
        raise RuntimeError(f"{_CUDA_MESSAGE}; got a tensor on {tensor.device}")
    if tensor.layout == torch.sparse_coo:
        return (_rebuild_sparse_coo, (tensor._indices(), tensor._values(), tuple(tensor.shape),
                                      tensor.is_coalesced(), tensor.requires_grad))
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested:
        raise TypeError(f"tensors of layout {tensor.layout} (quantized={tensor.is_quantized}, "
                        f"nested={tensor.is_nested}) cannot be sent over ringtorch RPC; "
                        f"send dense or sparse COO tensors")
    if ctx is not None:
        ctx.tensors.append(tensor)
    data = tensor.detach().resolve_conj().resolve_neg()
    if not data.is_contiguous():
        data = data.contiguous()
    buf = pickle.PickleBuffer(_buffers.byte_view(data))
    return (_rebuild_tensor, (tensor.dtype, tuple(tensor.shape), tensor.requires_grad, buf))


class _RpcPickler(pickle.Pickler):
    dispatch_table = copyreg.dispatch_table.copy()
    dispatch_table[torch.Tensor] = _reduce_tensor


def register_reducer(cls: type, reducer: Callable[[Any], Any]) -> None:
    """Pickle instances of exactly ``cls`` with ``reducer`` in every RPC message."""
    _RpcPickler.dispatch_table[cls] = reducer


class _Pickling:
    """A pickler and its output buffer, reused by one thread (creating them costs more than
    pickling a small call)."""

    __slots__ = ("buffers", "busy", "out", "pickler")

    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.buffers: list[pickle.PickleBuffer] = []
        self.pickler = _RpcPickler(self.out, protocol=5, buffer_callback=self._collect)
        self.busy = False

    def _collect(self, buf: pickle.PickleBuffer) -> None:
        self.buffers.append(buf)


def _pickling(thread: PerThread) -> _Pickling:
    cached: _Pickling | None = thread.pickling
    if cached is None or cached.busy:
        work = _Pickling()
        if cached is None:
            thread.pickling = work
        return work
    return cached


def encode(obj: Any, dst: int) -> Encoded:
    """Pickle ``obj`` for worker ``dst``: in-band bytes plus out-of-band buffers.

    Raises:
        Whatever pickling raises (an unpicklable object, a CUDA tensor); nothing was sent.
    """
    ctx = EncodeContext(dst)
    thread = STATE.thread
    work = _pickling(thread)
    work.busy = True
    saved = thread.encode
    thread.encode = ctx
    try:
        work.pickler.dump(obj)
        data = work.out.getvalue()
    except BaseException:
        thread.pickling = None  # a pickler that failed half way is not reused
        for undo in ctx.rollback:
            undo()
        raise
    finally:
        thread.encode = saved
        work.busy = False
    buffers = [b.raw() for b in work.buffers]
    work.buffers = []
    work.out.seek(0)
    work.out.truncate()
    work.pickler.clear_memo()
    return Encoded(data, buffers, ctx.holds, ctx.tensors)


def decode(data: Any, buffers: list[Any], src: int,
           on_tensor: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Any:
    """Load a message pickled by ``encode`` on worker ``src``.

    Raises:
        AttributeError: a function or class of the message does not exist here; the message
            says that functions are sent by name (torch's hint).
        Whatever unpickling raises otherwise.
    """
    thread = STATE.thread
    saved = thread.decode
    thread.decode = DecodeContext(src, on_tensor)
    try:
        return pickle.loads(data, buffers=buffers)
    except AttributeError as exc:
        raise AttributeError(
            f"{exc} Default RPC pickler does not serialize function code. Ensure that UDFs "
            f"are defined on both caller and callee modules.") from exc
    finally:
        thread.decode = saved


def copy_buffers(buffers: list[memoryview]) -> list[np.ndarray]:
    """Private copies of out-of-band buffers (for calls a worker makes to itself)."""
    return [np.frombuffer(buf, dtype=np.uint8).copy() for buf in buffers]


__all__ = [
    "DecodeContext",
    "EncodeContext",
    "Encoded",
    "copy_buffers",
    "decode",
    "decode_context",
    "encode",
    "encode_context",
    "register_reducer",
]

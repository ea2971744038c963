"""The one place where tensors and NumPy arrays become memory for collectives, objects and RPC.

Backends move flat, contiguous CPU tensors; users hand in tensors of any shape, dtype and
layout, or NumPy arrays. This module bridges the two without copies where the memory allows:

* a NumPy array becomes a torch tensor sharing its memory (``torch.from_numpy``), so results
  written into the tensor land in the array;
* a contiguous tensor becomes a 1-D view of itself; a complex one a view of its real pairs
  (``torch.view_as_real``), as torch does before every collective;
* a non-contiguous tensor is staged: a contiguous copy goes to the backend and, for outputs,
  the result is copied back into the caller's tensor afterwards (:class:`Staged`);
* tensors that lie back to back in one storage (the views of one buffer that object
  collectives and DDP buckets make) are used as one flat tensor (:func:`adjacent_flat`);
* a flat tensor becomes its bytes, a uint8 NumPy array (:func:`as_bytes`, what the
  collective algorithms move and reduce), a memoryview (:func:`byte_view`) or a raw address
  (:func:`address`, for mpi4py); bytes become a typed tensor again (:func:`typed_view`).

Nothing else in ringtorch reaches into a tensor's storage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

# Every dtype torch has, with its wire code (stable: it travels in fingerprints and object
# frames) and its NumPy twin (None where NumPy has none, e.g. bfloat16).
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3,
    torch.uint8: 4, torch.int8: 5, torch.int16: 6, torch.int32: 7, torch.int64: 8,
    torch.bool: 9, torch.complex64: 10, torch.complex128: 11, torch.complex32: 12,
    torch.uint16: 13, torch.uint32: 14, torch.uint64: 15,
    torch.float8_e4m3fn: 16, torch.float8_e5m2: 17, torch.float8_e4m3fnuz: 18,
    torch.float8_e5m2fnuz: 19,
}
DTYPES_BY_CODE: dict[int, torch.dtype] = {code: dt for dt, code in DTYPE_CODES.items()}


def is_buffer(obj: Any) -> bool:
    """Whether ``obj`` is something collectives accept: a torch tensor or a NumPy array."""
    return isinstance(obj, (torch.Tensor, np.ndarray))


def as_tensor(obj: Any) -> torch.Tensor:
    """``obj`` as a torch tensor sharing its memory (tensors are returned as they are).

    A NumPy array is wrapped with ``torch.from_numpy``; one whose memory torch cannot wrap
    (negative strides, read-only) is copied, and :func:`check_writable` rejects it as an
    output so that no result is silently lost.

    Raises:
        TypeError: ``obj`` is neither a tensor nor an array, or its dtype has no torch twin.
    """
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, np.ndarray):
        if obj.flags.writeable and all(s >= 0 for s in obj.strides):
            try:
                return torch.from_numpy(obj)
            except TypeError as exc:
                raise TypeError(f"NumPy arrays of dtype {obj.dtype} cannot be communicated: "
                                f"{exc}") from None
        try:
            return torch.from_numpy(np.ascontiguousarray(obj).copy())
        except TypeError as exc:
            raise TypeError(f"NumPy arrays of dtype {obj.dtype} cannot be communicated: "
                            f"{exc}") from None
    raise TypeError(f"expected a torch.Tensor or a numpy.ndarray, got {type(obj)}")


def check_writable(obj: Any, name: str) -> None:
    """Reject, before anything is sent, a NumPy output array the results cannot reach.

    Raises:
        ValueError: the array is read-only or has negative strides; the message names it.
    """
    if isinstance(obj, np.ndarray) and (
            not obj.flags.writeable or any(s < 0 for s in obj.strides)):
        why = "is read-only" if not obj.flags.writeable else "has negative strides"
        raise ValueError(f"the output array `{name}` {why}: results cannot be written into it; "
                         f"pass a writable array (e.g. np.ascontiguousarray(a))")


def real_view(tensor: torch.Tensor) -> torch.Tensor:
    """A complex tensor as its (real, imag) pairs, as torch sends it; others unchanged. Both
    outside autograd: one that requires grad (a parameter) is its ``detach()``, the same
    memory, since collectives read and write the caller's memory as torch's do, without
    recording anything for autograd (in-place writes refuse a tensor that requires grad)."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


def flat_view(tensor: torch.Tensor) -> torch.Tensor | None:
    """The 1-D view of a contiguous tensor (complex as real pairs); None if not contiguous."""
    tensor = real_view(tensor)
    if not tensor.is_contiguous():
        return None
    return tensor.view(-1)


class Staged:
    """One caller tensor as the backend sees it: ``flat`` is 1-D and contiguous.

    ``flat`` is a view of the caller's memory when it is contiguous; otherwise a scratch
    tensor, filled from the caller's tensor when the operation reads it, and copied back into
    it by :meth:`finish` when the operation writes it.
    """

    __slots__ = ("flat", "_target")

    def __init__(self, tensor: torch.Tensor, *, read: bool, write: bool) -> None:
        self._target: torch.Tensor | None = None
        if (tensor.ndim == 1 and not tensor.requires_grad and not tensor.is_complex()
                and tensor.is_contiguous()):
            self.flat = tensor  # already flat: a view of it would cost more than the checks
            return
        view = flat_view(tensor)
        if view is not None:
            self.flat = view
            return
        real = real_view(tensor)
        if read:
            self.flat = real.contiguous().view(-1)
        else:
            self.flat = torch.empty(real.numel(), dtype=real.dtype)
        if write:
            self._target = real

    @property
    def copied(self) -> bool:
        """Whether results go through a scratch copy (the caller's tensor is strided)."""
        return self._target is not None

    def finish(self) -> None:
        """Copy the result back into the caller's tensor if it was staged through a copy."""
        if self._target is not None:
            self._target.copy_(self.flat.view(self._target.shape))


def adjacent_flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """One 1-D tensor spanning ``tensors`` when they lie back to back in one storage.

    True for the per-rank views of one buffer (``[buf[i*n:(i+1)*n] for i ...]``) that object
    collectives and bucketed gradients use: a backend can then write every rank's part in
    place, with no copy afterwards. None when the tensors are not laid out so.
    """
    if not tensors:
        return None
    first = real_view(tensors[0])
    dtype = first.dtype
    storage = first.untyped_storage()
    offset = first.storage_offset()
    expected = offset
    for tensor in tensors:
        real = real_view(tensor)
        if (real.dtype != dtype or not real.is_contiguous()
                or real.untyped_storage().data_ptr() != storage.data_ptr()
                or real.storage_offset() != expected):
            return None
        expected += real.numel()
    flat = torch.empty(0, dtype=dtype)
    flat.set_(storage, offset, (expected - offset,), (1,))
    return flat


def _nothing() -> None:
    return None


def pack(ts: Sequence[torch.Tensor], *, read: bool,
         own: bool = False) -> tuple[torch.Tensor, Callable[[], None]]:
    """One flat tensor holding ``ts`` back to back, and the step that copies results back.

    Tensors already back to back in one storage are used in place (nothing to copy back);
    otherwise a scratch buffer is made, filled from ``ts`` when ``read``. ``own`` forces a
    private copy (for an input the backend may overwrite).
    """
    adjacent = None if own else adjacent_flat(ts)
    if adjacent is not None:
        return adjacent, _nothing
    reals = [real_view(t) for t in ts]
    if read:
        flat = torch.cat([r.reshape(-1) for r in reals])
    else:
        flat = torch.empty(sum(r.numel() for r in reals), dtype=reals[0].dtype)

    def finish() -> None:
        unpack(flat, ts)

    return flat, finish


def unpack(flat: torch.Tensor, ts: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of ``flat`` into the tensors ``ts`` (any layout)."""
    offset = 0
    for t in ts:
        real = real_view(t)
        n = real.numel()
        real.copy_(flat[offset:offset + n].view(real.shape))
        offset += n


class _Memory:
    """What :func:`_shared_array` hands NumPy: the address and size of a tensor's bytes (the
    array protocol), and the tensor itself, which the array keeps alive as its ``base``."""

    __slots__ = ("__array_interface__", "tensor")


def _shared_array(tensor: torch.Tensor) -> np.ndarray:
    """A 1-D uint8 NumPy array over a contiguous CPU tensor's bytes (it keeps the tensor alive).

    Not through ``Tensor.numpy()``: numpy() marks the tensor's storage as not resizable for
    good, and torch's FSDP frees the storage of the tensors it gathered into by resizing it
    to 0 (a tensor that went through a gloo collective can be freed so; one that went through
    ringtorch's must be too). Not through DLPack either, which leaves the storage alone but
    costs 2.4 µs a call against numpy()'s 0.7: the array protocol costs what numpy() did.
    Requires-grad tensors are read as they are (the same memory, outside autograd).

    Raises:
        RuntimeError: the tensor has its conjugate or negative bit set (its memory does not
            hold its values), as numpy() refuses it.
    """
    if tensor.is_conj() or tensor.is_neg():
        raise RuntimeError("a tensor with its conjugate or negative bit set has no plain bytes: "
                           "call resolve_conj() / resolve_neg() on it first")
    memory = _Memory()
    memory.tensor = tensor
    nbytes = tensor.nbytes
    memory.__array_interface__ = {"data": (tensor.data_ptr() if nbytes else 0, False),
                                  "shape": (nbytes,), "typestr": "|u1", "version": 3}
    return np.asarray(memory)


def as_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor as a 1-D uint8 NumPy array sharing its memory
    (any dtype, bfloat16 included; a tensor that requires grad too: the same memory, outside
    autograd): what the collective algorithms work on. One call costs what ``numpy()`` did
    (a collective's fixed cost is a few microseconds) and leaves the storage resizable."""
    return _shared_array(tensor)


def bytes_at(address: int, nbytes: int) -> np.ndarray:
    """A 1-D uint8 NumPy array over ``nbytes`` of raw memory at ``address`` that keeps
    nothing alive: its user keeps the memory alive while it uses the array (a backend caches
    these per (address, size) for its hot path, where the caller's tensor outlives the call;
    :func:`as_bytes` costs three times as much)."""
    memory = _Memory()
    memory.tensor = None
    memory.__array_interface__ = {"data": (address, False), "shape": (nbytes,),
                                  "typestr": "|u1", "version": 3}
    return np.asarray(memory)


def typed_view(data: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Bytes (a uint8 NumPy array, e.g. from :func:`as_bytes` or a shared-memory slot) as a
    1-D tensor of ``dtype`` sharing their memory (for torch's kernels on dtypes NumPy lacks)."""
    return torch.from_numpy(data).view(dtype)


def address(tensor: torch.Tensor) -> tuple[int, int]:
    """(address, byte count) of a contiguous CPU tensor's memory, for libraries that take raw
    buffers (mpi4py's ``buffer.fromaddress``: 0.2 µs where a NumPy view costs 1.5-3 µs). The
    caller keeps the tensor alive while the address is in use.

    Raises:
        ValueError: the tensor is not contiguous.
    """
    if not tensor.is_contiguous():
        raise ValueError("a raw address needs a contiguous tensor (the ProcessGroup stages "
                         "non-contiguous ones)")
    return tensor.data_ptr(), tensor.nbytes


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors share any byte of memory (an operation that reads one
    while writing the other then needs a private copy of what it reads)."""
    if not a.nbytes or not b.nbytes:
        return False
    pa, pb = a.data_ptr(), b.data_ptr()
    return pa < pb + b.nbytes and pb < pa + a.nbytes


def byte_view(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, shared with it (any dtype, bfloat16 included)."""
    if tensor.numel() == 0:
        return memoryview(b"")
    # (one element with a 0 stride, as autograd's expanded gradients, counts as contiguous)
    if not tensor.is_contiguous():
        raise ValueError("byte_view needs a contiguous tensor")
    return memoryview(_shared_array(tensor)).cast("B")  # type: ignore[arg-type]


def tensor_from_bytes(buf: Any, dtype: torch.dtype, shape: Sequence[int]) -> torch.Tensor:
    """A tensor of ``dtype`` and ``shape`` over the bytes of ``buf`` (shared, not copied)."""
    numel = 1
    for dim in shape:
        numel *= dim
    if numel == 0:
        return torch.empty(tuple(shape), dtype=dtype)
    raw = torch.frombuffer(buf, dtype=torch.uint8)
    return raw.view(dtype).view(tuple(shape))


def uint8_tensor(buf: bytes | bytearray | memoryview) -> torch.Tensor:
    """A 1-D uint8 tensor over ``buf`` (shared with a bytearray/memoryview, copied from bytes)."""
    if isinstance(buf, bytes):
        buf = bytearray(buf)
    if len(buf) == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(buf, dtype=torch.uint8)


__all__ = [
    "DTYPES_BY_CODE",
    "DTYPE_CODES",
    "Staged",
    "adjacent_flat",
    "address",
    "bytes_at",
    "as_bytes",
    "as_tensor",
    "byte_view",
    "check_writable",
    "flat_view",
    "is_buffer",
    "overlaps",
    "pack",
    "real_view",
    "tensor_from_bytes",
    "typed_view",
    "uint8_tensor",
    "unpack",
]

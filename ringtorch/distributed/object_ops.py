"""Object collectives: Python objects through the tensor collectives, pickled with protocol 5.

Each object is pickled once; the bytes of tensors and NumPy arrays inside it go out of band
(protocol 5 buffers) instead of through the pickle stream, and come back as tensors/arrays
over the received buffer, without another copy. An object travels as one frame:

    offset  0  u32  number of out-of-band buffers (n)
    offset  4  u32  0 (reserved)
    offset  8  u64  pickle stream bytes
    offset 16  u64  buffer 0 bytes ... buffer n-1 bytes
    then the pickle stream, then the buffers back to back

Frames are self-describing, so padded frames (gathers pad to the largest) decode as is.
Security: unpickling runs code chosen by the sender. ringtorch unpickles only frames that
came through a group's backend, whose connections are authenticated (HMAC on the job's
secret) before any byte is read; torch accepts unauthenticated peers.

The functions keep torch's semantics: lists are filled in place, ``gather_object`` fills its
list on ``dst`` only, ``scatter_object_list`` sets element 0 of the output list; none has an
``async_op``; a rank outside the group gets a warning and nothing happens.

Each is one operation of its own for the flight recorder (``all_gather_object``, ...: kind
"collective", or "p2p" for send/recv_object_list), from its start to its end; the tensor
collectives it runs are recorded as they always are, each naming it as its ``parent``
(the hang report says "all_gather #4 ... of all_gather_object"), and only they count in the
end-of-job summary.
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import Any

import torch

from ringtorch import _buffers
from ringtorch._observe.operation import COLLECTIVE, P2P, Operation
from ringtorch._observe.recorder import RECORDER
from ringtorch.collectives.options import AllgatherOptions, BroadcastOptions, GatherOptions, ScatterOptions
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.collectives.work import Work
from ringtorch.distributed import _args as a
from ringtorch.distributed import groups, ops

_HEAD = struct.Struct("<IIQ")
_LEN = struct.Struct("<Q")


def _rebuild_tensor(buf: Any, code: int, shape: tuple[int, ...], requires_grad: bool) -> Any:
    t = _buffers.tensor_from_bytes(buf, _buffers.DTYPES_BY_CODE[code], shape)
    return t.requires_grad_(True) if requires_grad else t


class _Pickler(pickle.Pickler):
    """Sends the bytes of plain CPU tensors out of band (NumPy arrays do so on their own)."""

    def reducer_override(self, obj: Any) -> Any:
        if (type(obj) is torch.Tensor and obj.device.type == "cpu"
                and obj.layout == torch.strided and obj.dtype in _buffers.DTYPE_CODES
                and not obj.is_conj() and not obj.is_neg()
                and (not obj.requires_grad or obj.is_leaf)):
            data = obj.detach().contiguous()
            return _rebuild_tensor, (pickle.PickleBuffer(_buffers.byte_view(data)),
                                     _buffers.DTYPE_CODES[obj.dtype], tuple(obj.shape),
                                     obj.requires_grad)
        return NotImplemented


def encode(obj: Any) -> torch.Tensor:
    """``obj`` as one frame (a uint8 tensor)."""
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    _Pickler(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
    views = [b.raw() for b in buffers]
    head = _HEAD.pack(len(views), 0, stream.getbuffer().nbytes)
    lengths = b"".join(_LEN.pack(v.nbytes) for v in views)
    total = len(head) + len(lengths) + stream.getbuffer().nbytes + sum(v.nbytes for v in views)
    frame = bytearray(total)
    offset = 0
    for part in (head, lengths, stream.getbuffer(), *views):
        n = memoryview(part).nbytes
        frame[offset:offset + n] = part
        offset += n
    return _buffers.uint8_tensor(frame)


def decode(frame: torch.Tensor) -> Any:
    """The object in ``frame`` (a uint8 tensor, maybe padded); its tensors/arrays share the
    frame's memory."""
    view = _buffers.byte_view(frame.contiguous())
    count, _, pickle_nbytes = _HEAD.unpack_from(view, 0)
    offset = _HEAD.size
    lengths = [_LEN.unpack_from(view, offset + 8 * i)[0] for i in range(count)]
    offset += 8 * count
    stream = view[offset:offset + pickle_nbytes]
    offset += pickle_nbytes
    buffers = []
    for n in lengths:
        buffers.append(view[offset:offset + n])
        offset += n
    return pickle.loads(stream, buffers=buffers)


class _Whole:
    """The operation of an object collective, from the ``with`` to the end of its block (a
    class, not a generator: the flight recorder finds the user's frame as the first one
    outside ringtorch, and contextlib's would come first)."""

    def __init__(self, group: ProcessGroup, op: str, kind: str = COLLECTIVE,
                 peer: int = -1) -> None:
        self.o = Operation(kind, group.group_name, op, -1, peer)

    def __enter__(self) -> Operation:
        o = self.o
        o.started = o.enqueued
        if RECORDER.on:
            RECORDER.add_whole(o)
        return o

    def __exit__(self, kind: Any, error: BaseException | None, tb: Any) -> None:
        RECORDER.finished(self.o, error)


def _part(whole: Operation, work: Work | None) -> Work | None:
    """Wait for one of ``whole``'s tensor operations, named its part."""
    if work is not None:
        work.operation.parent = whole
        work.wait()
    return work


def _sizes(whole: Operation, group: ProcessGroup, local: int) -> list[int]:
    size = group.size()
    sizes = torch.zeros(size, dtype=torch.int64)
    _part(whole, group.allgather([[sizes[i:i + 1] for i in range(size)]],
                                 [torch.tensor([local])], AllgatherOptions(asyncOp=False)))
    return sizes.tolist()


def _broadcast(whole: Operation, t: torch.Tensor, group: ProcessGroup, root: int) -> None:
    _part(whole, group.broadcast([t], BroadcastOptions(rootRank=root, asyncOp=False)))


def _padded(frame: torch.Tensor, nbytes: int) -> torch.Tensor:
    if frame.numel() == nbytes:
        return frame
    out = torch.zeros(nbytes, dtype=torch.uint8)
    out[:frame.numel()] = frame
    return out


def all_gather_object(object_list: list[Any], obj: Any,
                      group: ProcessGroup | None = None) -> None:
    """Gather ``obj`` from every rank into ``object_list`` (one entry per rank, in order).

    Raises:
        IndexError: ``object_list`` is shorter than the group (before anything is sent).
    """
    if a.not_in_group(group):
        a.warn_not_in_group("all_gather_object")
        return
    pg = a.group_or_default(group)
    size = pg.size()
    if len(object_list) < size:
        raise IndexError(f"all_gather_object: object_list has {len(object_list)} entries but "
                         f"the group has {size} ranks: pass a list of at least {size} entries")
    with _Whole(pg, "all_gather_object") as whole:
        frame = encode(obj)
        longest = max(_sizes(whole, pg, frame.numel()))
        out = torch.empty(longest * size, dtype=torch.uint8)
        _part(whole, pg.allgather([[out[i * longest:(i + 1) * longest] for i in range(size)]],
                                  [_padded(frame, longest)], AllgatherOptions(asyncOp=False)))
        for i in range(size):
            object_list[i] = decode(out[i * longest:(i + 1) * longest])


def gather_object(obj: Any, object_gather_list: list[Any] | None = None,
                  dst: int | None = None, group: ProcessGroup | None = None,
                  group_dst: int | None = None) -> None:
    """Gather ``obj`` from every rank into ``object_gather_list`` on rank ``dst`` (global
    rank 0 by default); other ranks pass None.

    Raises:
        ValueError: a list on a non-destination rank, or none on the destination.
    """
    group = a.group_or_default(group)
    if dst is None and group_dst is None:
        dst = 0
    group_dst = a.canonical_rank(group, dst, group_dst)
    if a.not_in_group(group):
        a.warn_not_in_group("gather_object")
        return
    me, size = group.rank(), group.size()
    ops._validate_output_list_for_rank(me, group_dst, object_gather_list)
    if me == group_dst and len(object_gather_list) < size:  # type: ignore[arg-type]
        raise IndexError(f"gather_object: object_gather_list has "
                         f"{len(object_gather_list)} entries but the group has {size} ranks")  # type: ignore[arg-type]
    with _Whole(group, "gather_object") as whole:
        frame = encode(obj)
        longest = max(_sizes(whole, group, frame.numel()))
        out = torch.empty(longest * size, dtype=torch.uint8) if me == group_dst else None
        parts = [[out[i * longest:(i + 1) * longest] for i in range(size)]] if (
            out is not None) else []
        _part(whole, group.gather(parts, [_padded(frame, longest)],
                                  GatherOptions(rootRank=group_dst, asyncOp=False)))
        if out is not None:
            for i in range(size):
                object_gather_list[i] = decode(out[i * longest:(i + 1) * longest])  # type: ignore[index]


def broadcast_object_list(object_list: list[Any], src: int | None = None,
                          group: ProcessGroup | None = None, device: Any = None,
                          group_src: int | None = None) -> None:
    """Replace ``object_list``'s entries on every rank with those of rank ``src`` (global
    rank 0 by default); every rank passes a list of the same length."""
    group = a.group_or_default(group)
    if src is None and group_src is None:
        src = 0
    group_src = a.canonical_rank(group, src, group_src)
    if a.not_in_group(group):
        a.warn_not_in_group("broadcast_object_list")
        return
    is_src = group.rank() == group_src
    with _Whole(group, "broadcast_object_list") as whole:
        if is_src:
            frames = [encode(o) for o in object_list]
            sizes = torch.tensor([f.numel() for f in frames], dtype=torch.int64)
        else:
            sizes = torch.empty(len(object_list), dtype=torch.int64)
        _broadcast(whole, sizes, group, group_src)
        if is_src:
            payload = frames[0] if len(frames) == 1 else torch.cat(frames)
        else:
            payload = torch.empty(int(sizes.sum().item()), dtype=torch.uint8)
        _broadcast(whole, payload, group, group_src)
        if not is_src:
            offset = 0
            for i, n in enumerate(sizes.tolist()):
                object_list[i] = decode(payload[offset:offset + n])
                offset += n


def scatter_object_list(scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None = None,
                        src: int | None = None, group: ProcessGroup | None = None,
                        group_src: int | None = None) -> None:
    """Send ``scatter_object_input_list[i]`` from rank ``src`` (global rank 0 by default) to
    rank i, which finds it in ``scatter_object_output_list[0]``.

    Raises:
        ValueError: the output list is not a non-empty list, or ``src`` has no input list.
    """
    group = a.group_or_default(group)
    if src is None and group_src is None:
        src = 0
    group_src = a.canonical_rank(group, src, group_src)
    if a.not_in_group(group):
        a.warn_not_in_group("scatter_object_list")
        return
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("Expected argument scatter_object_output_list to be a list of size at "
                         "least 1.")
    is_src = group.rank() == group_src
    if is_src and scatter_object_input_list is None:
        raise ValueError("source rank must provide non-None scatter_object_input_list")
    with _Whole(group, "scatter_object_list") as whole:
        longest = torch.zeros(1, dtype=torch.int64)
        parts = []
        if is_src:
            frames = [encode(o) for o in scatter_object_input_list]  # type: ignore[union-attr]
            longest[0] = max(f.numel() for f in frames)
            parts = [[_padded(f, int(longest.item())) for f in frames]]
        _broadcast(whole, longest, group, group_src)
        out = torch.empty(int(longest.item()), dtype=torch.uint8)
        _part(whole, group.scatter([out], parts,
                                   ScatterOptions(rootRank=group_src, asyncOp=False)))
        scatter_object_output_list[0] = decode(out)


def send_object_list(object_list: list[Any], dst: int | None = None,
                     group: ProcessGroup | None = None, device: Any = None,
                     group_dst: int | None = None, use_batch: bool = False) -> None:
    """Send the objects of ``object_list`` to rank ``dst`` (global; or ``group_dst``), whose
    ``recv_object_list`` passes a list of the same length."""
    group = a.group_or_default(group)
    group_dst = a.canonical_rank(group, dst, group_dst)
    if a.not_in_group(group):
        a.warn_not_in_group("send_object_list")
        return
    a.check_not_self_rank(group, group_dst, "destination")
    with _Whole(group, "send_object_list", P2P, group_dst) as whole:
        frames = [encode(o) for o in object_list]
        sizes = torch.tensor([f.numel() for f in frames], dtype=torch.int64)
        _part(whole, group.send([sizes], group_dst, 0, async_op=False))
        payload = frames[0] if len(frames) == 1 else torch.cat(frames)
        _part(whole, group.send([payload], group_dst, 0, async_op=False))


def recv_object_list(object_list: list[Any], src: int | None = None,
                     group: ProcessGroup | None = None, device: Any = None,
                     group_src: int | None = None, use_batch: bool = False) -> int:
    """Receive objects into ``object_list`` from rank ``src`` (global; or ``group_src``; any
    rank when neither is given: the first to send).

    Returns:
        The sender's global rank; -1 on a rank outside ``group``.
    """
    group = a.group_or_default(group)
    if src is not None or group_src is not None:
        group_src = a.canonical_rank(group, src, group_src)
        if not a.not_in_group(group):
            a.check_not_self_rank(group, group_src, "source")
    if a.not_in_group(group):
        a.warn_not_in_group("recv_object_list")
        return -1
    with _Whole(group, "recv_object_list", P2P,
                -1 if group_src is None else group_src) as whole:
        sizes = torch.empty(len(object_list), dtype=torch.int64)
        if group_src is None:  # from whichever rank sends first
            work = _part(whole, group.recv_anysource([sizes], 0, async_op=False))
            group_src = work.source_rank()  # type: ignore[union-attr]
            a.check_not_self_rank(group, group_src, "source")
            whole.peer = group_src
        else:
            _part(whole, group.recv([sizes], group_src, 0, async_op=False))
        payload = torch.empty(int(sizes.sum().item()), dtype=torch.uint8)
        _part(whole, group.recv([payload], group_src, 0, async_op=False))
        offset = 0
        for i, n in enumerate(sizes.tolist()):
            object_list[i] = decode(payload[offset:offset + n])
            offset += n
    return groups.get_global_rank(group, group_src)


__all__ = [
    "all_gather_object",
    "broadcast_object_list",
    "decode",
    "encode",
    "gather_object",
    "recv_object_list",
    "scatter_object_list",
    "send_object_list",
]

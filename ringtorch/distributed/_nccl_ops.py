"""The facade's operations on device tensors, run by a group's NCCL side (``_nccl.py``).

``_device_staging.staged_call`` hands an entry point's arguments here when the call's group
has an :class:`~ringtorch.distributed._nccl.NcclGroup` (its backend map names ``cuda:nccl``); each
operation checks its arguments as torch's ProcessGroupNCCL does, then enqueues the NCCL calls
on the group's communication stream (list forms go through a scratch buffer, copied on that
stream). Rule kept: the entry point's result is torch's (a Work with ``async_op=True``, else
None; ``recv`` the sender's rank), and nothing here waits for device work on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ringtorch._device import nccl_comm
from ringtorch.collectives.reduce_op import RedOpType, op_type, premul_factor
from ringtorch.distributed import _args as a
from ringtorch.distributed import groups
from ringtorch.distributed._nccl import NcclGroup
from ringtorch.distributed._world import _world, is_non_member

_UNSUPPORTED = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)


def group_of(group: Any) -> NcclGroup | None:
    """The NCCL side of ``group`` (None: the default group), if it has one."""
    pg = _world.default_pg if group is None else group
    if pg is None or is_non_member(pg):
        return None
    side = getattr(pg, "device_backend", None)
    return side if isinstance(side, NcclGroup) else None


def supported(name: str) -> bool:
    """Whether the entry point ``name`` runs on NCCL (else: the staged path or a refusal)."""
    return name in _OPS


def call(side: NcclGroup, name: str, kw: dict[str, Any]) -> Any:
    """Run the entry point ``name`` with its arguments ``kw`` on ``side``."""
    return _OPS[name](side, kw)


def _device(side: NcclGroup, tensors: list[torch.Tensor]) -> int:
    rt = side.rt
    for t in tensors:
        if not rt.is_device(t):
            raise ValueError(f"Tensors must be CUDA and dense: backend 'nccl' got a tensor on "
                             f"{t.device} among device tensors")
        if not t.is_contiguous():
            raise ValueError("Tensors must be contiguous")
    return rt.device_index(tensors[0])


def _op(op: Any, dtype: torch.dtype) -> tuple[int, Any]:
    """(ncclRedOp_t, PREMUL_SUM factor or None)."""
    kind = op_type(op)
    if kind in _UNSUPPORTED:
        raise ValueError(f"Cannot use ReduceOp.{kind.name} with NCCL")
    if kind is RedOpType.PREMUL_SUM:
        return nccl_comm.REDUCE_OPS["SUM"], premul_factor(op)
    if kind is RedOpType.AVG and not dtype.is_floating_point:
        raise ValueError("Cannot use ReduceOp.AVG with integral inputs on NCCL")
    return nccl_comm.REDUCE_OPS[kind.name], None


def _scaled(rt: Any, stream: Any, t: torch.Tensor, factor: Any, keep: list[Any]) -> torch.Tensor:
    """``t * factor`` computed on ``stream`` into scratch (PREMUL_SUM), or ``t`` itself."""
    if factor is None:
        return t
    out = torch.empty_like(t)
    keep.append(out)
    rt.launch(stream, lambda: torch.mul(t, factor, out=out))
    return out


def _rank(kw: dict[str, Any], group: Any, global_name: str, group_name: str) -> int:
    return a.canonical_rank(a.group_or_default(group), kw.get(global_name), kw.get(group_name))


def _collective(side: NcclGroup, name: str, tensors: list[torch.Tensor],
                outputs: list[torch.Tensor], kw: dict[str, Any],
                enqueue: Callable[[Any, Any, list[Any]], None]) -> Any:
    keep: list[Any] = list(tensors)

    def on_stream(comm: Any, stream: Any) -> None:
        enqueue(comm, stream, keep)

    return side.run(name, _device(side, tensors), on_stream, outputs, keep,
                    bool(kw.get("async_op", False)))


def _all_reduce(side: NcclGroup, kw: dict[str, Any]) -> Any:
    t = a.check_single_tensor(kw["tensor"], "tensor")
    code, factor = _op(kw["op"], t.dtype)

    def enqueue(comm: Any, stream: Any, keep: list[Any]) -> None:
        comm.all_reduce(_scaled(side.rt, stream, t, factor, keep), t, code, stream)

    return _collective(side, "allreduce", [t], [t], kw, enqueue)


def _broadcast(side: NcclGroup, kw: dict[str, Any]) -> Any:
    t = a.check_single_tensor(kw["tensor"], "tensor")
    root = _rank(kw, kw["group"], "src", "group_src")
    return _collective(side, "broadcast", [t], [t], kw,
                       lambda comm, stream, keep: comm.broadcast(t, t, root, stream))


def _reduce(side: NcclGroup, kw: dict[str, Any]) -> Any:
    t = a.check_single_tensor(kw["tensor"], "tensor")
    root = _rank(kw, kw["group"], "dst", "group_dst")
    code, factor = _op(kw["op"], t.dtype)

    def enqueue(comm: Any, stream: Any, keep: list[Any]) -> None:
        comm.reduce(_scaled(side.rt, stream, t, factor, keep), t, code, root, stream)

    return _collective(side, "reduce", [t], [t], kw, enqueue)


def _all_gather_single(side: NcclGroup, kw: dict[str, Any]) -> Any:
    out = a.check_single_tensor(kw["output_tensor"], "output_tensor")
    inp = a.check_single_tensor(kw["input_tensor"], "input_tensor")
    a.ensure_same_dtype(out, inp)
    if out.numel() != inp.numel() * side.size:
        raise ValueError("output tensor size must be equal to world_size times input "
                         "tensor size")
    return _collective(side, "_allgather_base", [out, inp], [out], kw,
                       lambda comm, stream, keep: comm.all_gather(inp, out, stream))


def _all_gather(side: NcclGroup, kw: dict[str, Any]) -> Any:
    outs = a.check_tensor_list(kw["tensor_list"], "tensor_list")
    t = a.check_single_tensor(kw["tensor"], "tensor")
    a.ensure_same_dtype(outs, t)
    if len(outs) != side.size or any(o.numel() != t.numel() for o in outs):
        raise ValueError(f"all_gather on NCCL needs a tensor_list of {side.size} tensors of "
                         f"the input's size")
    rt = side.rt

    def enqueue(comm: Any, stream: Any, keep: list[Any]) -> None:
        flat = torch.empty(side.size * t.numel(), dtype=t.dtype, device=t.device)
        keep.append(flat)
        comm.all_gather(t.reshape(-1), flat, stream)
        n = t.numel()
        rt.launch(stream, lambda: [o.copy_(flat[i * n:(i + 1) * n].view(o.shape))
                                   for i, o in enumerate(outs)])

    return _collective(side, "allgather", [t, *outs], outs, kw, enqueue)


def _reduce_scatter_single(side: NcclGroup, kw: dict[str, Any]) -> Any:
    out = a.check_single_tensor(kw["output"], "output")
    inp = a.check_single_tensor(kw["input"], "input")
    a.ensure_same_dtype(out, inp)
    if inp.numel() != out.numel() * side.size:
        raise ValueError("input tensor must be the same size as output size times world size")
    code, factor = _op(kw["op"], out.dtype)

    def enqueue(comm: Any, stream: Any, keep: list[Any]) -> None:
        comm.reduce_scatter(_scaled(side.rt, stream, inp, factor, keep), out, code, stream)

    return _collective(side, "_reduce_scatter_base", [out, inp], [out], kw, enqueue)


def _reduce_scatter(side: NcclGroup, kw: dict[str, Any]) -> Any:
    out = a.check_single_tensor(kw["output"], "output")
    ins = a.check_tensor_list(kw["input_list"], "input_list")
    a.ensure_same_dtype(ins, out)
    if len(ins) != side.size or any(i.numel() != out.numel() for i in ins):
        raise ValueError(f"reduce_scatter on NCCL needs an input_list of {side.size} tensors "
                         f"of the output's size")
    code, factor = _op(kw["op"], out.dtype)
    rt = side.rt

    def enqueue(comm: Any, stream: Any, keep: list[Any]) -> None:
        flat = torch.empty(side.size * out.numel(), dtype=out.dtype, device=out.device)
        keep.append(flat)
        n = out.numel()
        rt.launch(stream, lambda: [flat[i * n:(i + 1) * n].copy_(x.reshape(-1))
                                   for i, x in enumerate(ins)])
        comm.reduce_scatter(_scaled(rt, stream, flat, factor, keep), out, code, stream)

    return _collective(side, "reduce_scatter", [out, *ins], [out], kw, enqueue)


def _p2p(side: NcclGroup, kw: dict[str, Any], kind: str, async_op: bool) -> Any:
    t = a.check_single_tensor(kw["tensor"], "tensor")
    group = kw["group"]
    if kind == "send":
        peer = _rank(kw, group, "dst", "group_dst")
    else:
        if kw.get("src") is None and kw.get("group_src") is None:
            raise ValueError("backend 'nccl' cannot receive from any source: name src")
        peer = _rank(kw, group, "src", "group_src")
    if peer == side.rank:
        raise ValueError(f"Invalid {'destination' if kind == 'send' else 'source'} rank: "
                         f"it should not be the same as the rank of the current process.")

    def enqueue(comm: Any, stream: Any, keep: list[Any]) -> None:
        getattr(comm, kind)(t, peer, stream)

    keep: list[Any] = [t]
    work = side.run(kind, _device(side, [t]), lambda comm, stream: enqueue(comm, stream, keep),
                    [t] if kind == "recv" else [], keep, True)
    if async_op:
        return work
    work.wait()
    if kind == "recv":
        return groups.get_global_rank(a.group_or_default(group), peer)
    return None


def _grouped(side: NcclGroup, name: str, kw: dict[str, Any], tensors: list[torch.Tensor],
             outputs: list[torch.Tensor], copies: list[tuple[torch.Tensor, torch.Tensor]],
             p2p: list[tuple[str, torch.Tensor, int]]) -> Any:
    """One operation made of local copies and sends/receives that progress together (one
    NCCL group), as torch's ProcessGroupNCCL runs gather, scatter and all-to-all."""
    def enqueue(comm: Any, stream: Any, keep: list[Any]) -> None:
        if copies:
            side.rt.launch(stream, lambda: [dst.copy_(src) for dst, src in copies])
        if p2p:
            comm.group_start()
            try:
                for kind, buf, peer in p2p:
                    getattr(comm, kind)(buf, peer, stream)
            finally:
                comm.group_end()

    return _collective(side, name, tensors, outputs, kw, enqueue)


def _root(kw: dict[str, Any], global_name: str, group_name: str) -> int:
    if kw.get(global_name) is None and kw.get(group_name) is None:
        return _rank({**kw, global_name: 0}, kw["group"], global_name, group_name)
    return _rank(kw, kw["group"], global_name, group_name)


def _sized(parts: list[torch.Tensor], like: torch.Tensor, what: str, size: int) -> None:
    if len(parts) != size or any(p.numel() != like.numel() or p.dtype != like.dtype
                                 for p in parts):
        raise ValueError(f"{what} must hold {size} tensors of the same size and dtype as "
                         f"the tensor")


def _gather(side: NcclGroup, kw: dict[str, Any]) -> Any:
    t = a.check_single_tensor(kw["tensor"], "tensor")
    root = _root(kw, "dst", "group_dst")
    if side.rank != root:
        return _grouped(side, "gather", kw, [t], [], [], [("send", t, root)])
    outs = a.check_tensor_list(kw["gather_list"], "gather_list")
    _sized(outs, t, "gather_list", side.size)
    p2p = [("recv", o, r) for r, o in enumerate(outs) if r != root]
    return _grouped(side, "gather", kw, [t, *outs], outs, [(outs[root], t)], p2p)


def _scatter(side: NcclGroup, kw: dict[str, Any]) -> Any:
    t = a.check_single_tensor(kw["tensor"], "tensor")
    root = _root(kw, "src", "group_src")
    if side.rank != root:
        return _grouped(side, "scatter", kw, [t], [t], [], [("recv", t, root)])
    ins = a.check_tensor_list(kw["scatter_list"], "scatter_list")
    _sized(ins, t, "scatter_list", side.size)
    p2p = [("send", i, r) for r, i in enumerate(ins) if r != root]
    return _grouped(side, "scatter", kw, [t, *ins], [t], [(t, ins[root])], p2p)


def _exchange(side: NcclGroup, name: str, kw: dict[str, Any], outs: list[torch.Tensor],
              ins: list[torch.Tensor], tensors: list[torch.Tensor],
              outputs: list[torch.Tensor]) -> Any:
    """Part r of ``ins`` to rank r, rank r's into part r of ``outs`` (empty parts skipped:
    both ends of a pair know its size)."""
    me = side.rank
    p2p: list[tuple[str, torch.Tensor, int]] = []
    for r in range(side.size):
        if r != me and ins[r].numel():
            p2p.append(("send", ins[r], r))
        if r != me and outs[r].numel():
            p2p.append(("recv", outs[r], r))
    return _grouped(side, name, kw, tensors, outputs, [(outs[me], ins[me])], p2p)


def _all_to_all_single(side: NcclGroup, kw: dict[str, Any]) -> Any:
    out = a.check_single_tensor(kw["output"], "output")
    inp = a.check_single_tensor(kw["input"], "input")
    a.ensure_same_dtype(out, inp)

    def parts(t: torch.Tensor, splits: Any, what: str) -> list[torch.Tensor]:
        if not splits:
            if t.shape[0] % side.size:
                raise ValueError(f"{what}'s first dimension ({t.shape[0]}) must divide by "
                                 f"the group's size ({side.size})")
            splits = [t.shape[0] // side.size] * side.size
        if len(splits) != side.size or sum(splits) != t.shape[0]:
            raise ValueError(f"{what} split sizes {list(splits)} do not split its first "
                             f"dimension ({t.shape[0]}) into {side.size} parts")
        return list(torch.split(t, list(splits)))

    outs = parts(out, kw.get("output_split_sizes"), "output")
    ins = parts(inp, kw.get("input_split_sizes"), "input")
    return _exchange(side, "alltoall_base", kw, outs, ins, [out, inp], [out])


def _all_to_all(side: NcclGroup, kw: dict[str, Any]) -> Any:
    outs = a.check_tensor_list(kw["output_tensor_list"], "output_tensor_list")
    ins = a.check_tensor_list(kw["input_tensor_list"], "input_tensor_list")
    if len(outs) != side.size or len(ins) != side.size:
        raise ValueError(f"all_to_all needs {side.size} input and {side.size} output tensors")
    a.ensure_same_dtype(outs, ins)
    return _exchange(side, "alltoall", kw, outs, ins, [*outs, *ins], outs)


def batch(side: NcclGroup, rt: Any, ops: list[tuple[str, torch.Tensor, int]]) -> list[Any] | None:
    """``batch_isend_irecv`` of device tensors on ``side``: one NCCL group of sends and
    receives (``ops``: kind, tensor, group peer), one Work for them all (returned for each,
    as torch's coalesced batch); None where the group's ranks share a GPU its NCCL cannot."""
    side.ensure(rt.device_index(ops[0][1]))
    if side.shared_path:
        return None
    for kind, _, peer in ops:
        if peer == side.rank:
            raise ValueError(f"backend 'nccl' cannot {kind} to or from its own rank in "
                             f"batch_isend_irecv")
    tensors = [t for _, t, _ in ops]
    work = _grouped(side, "batch_isend_irecv", {"async_op": True}, tensors,
                    [t for kind, t, _ in ops if kind == "recv"], [], ops)
    return [work] * len(ops)


_OPS: dict[str, Callable[[NcclGroup, dict[str, Any]], Any]] = {
    "gather": _gather,
    "scatter": _scatter,
    "all_to_all_single": _all_to_all_single,
    "all_to_all": _all_to_all,
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "all_gather": _all_gather,
    "all_gather_single": _all_gather_single,
    "reduce_scatter": _reduce_scatter,
    "reduce_scatter_single": _reduce_scatter_single,
    "send": lambda side, kw: _p2p(side, kw, "send", False),
    "recv": lambda side, kw: _p2p(side, kw, "recv", False),
    "isend": lambda side, kw: _p2p(side, kw, "send", True),
    "irecv": lambda side, kw: _p2p(side, kw, "recv", True),
}

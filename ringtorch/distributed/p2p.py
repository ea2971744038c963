"""Point-to-point operations of ringtorch.distributed: send, recv, isend, irecv, batches.

``dst``/``src`` are global ranks, ``group_dst``/``group_src``/``group_peer`` group ranks
(torch 2.13's keywords; giving both is an error). ``recv`` and ``irecv`` with no source take
a message from whichever rank sends first; ``recv`` returns that rank (global). Messages
between two ranks with one tag arrive in order; tags are honoured (unlike NCCL). Sends never
wait for the receiver to post its receive, so ``batch_isend_irecv`` lists may be in any order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.collectives.work import Work
from ringtorch.distributed import _args as a
from ringtorch.distributed import _nccl_ops, groups
from ringtorch.distributed._device_staging import device_runtime, staged, staged_call


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


def _isend(tensor: Any, dst: int | None, group: Any, tag: int, group_dst: int | None,
           async_op: bool) -> Work | None:
    group = a.group_or_default(group)
    group_dst = a.canonical_rank(group, dst, group_dst)
    t = a.check_single_tensor(tensor, "tensor")
    if a.not_in_group(group):
        a.warn_not_in_group("isend")
        return None
    return group.send([_real(t)], group_dst, tag, async_op=async_op)


@staged(reads=("tensor",), writes=())
def isend(tensor: torch.Tensor, dst: int | None = None, group: ProcessGroup | None = None,
          tag: int = 0, group_dst: int | None = None) -> Work | None:
    """Start sending ``tensor`` to rank ``dst`` (global; or ``group_dst``); returns its Work.

    Do not modify ``tensor`` before the Work completes. Unlike ``send``, a rank may isend to
    itself (an ``irecv`` from itself takes the message).
    """
    if (rt := device_runtime(tensor)) is not None:  # device tensors: staged
        return staged_call(rt, isend, locals())
    return _isend(tensor, dst, group, tag, group_dst, async_op=True)


def _irecv(tensor: Any, src: int | None, group: Any, tag: int, group_src: int | None,
           async_op: bool) -> Work | None:
    t = a.check_single_tensor(tensor, "tensor")
    if a.not_in_group(group):
        a.warn_not_in_group("irecv")
        return None
    a.check_outputs_writable(tensor, "tensor")
    group = a.group_or_default(group)
    if src is None and group_src is None:
        return group.recv_anysource([_real(t)], tag, async_op=async_op)
    group_src = a.canonical_rank(group, src, group_src)
    return group.recv([_real(t)], group_src, tag, async_op=async_op)


@staged(reads=(), writes=("tensor",))
def irecv(tensor: torch.Tensor, src: int | None = None, group: ProcessGroup | None = None,
          tag: int = 0, group_src: int | None = None) -> Work | None:
    """Start receiving into ``tensor`` from rank ``src`` (global; or ``group_src``; any rank
    when neither is given); returns its Work (``work._source_rank()`` names the sender)."""
    if (rt := device_runtime(tensor)) is not None:  # device tensors: staged
        return staged_call(rt, irecv, locals())
    return _irecv(tensor, src, group, tag, group_src, async_op=True)


@staged(reads=("tensor",), writes=())
def send(tensor: torch.Tensor, dst: int | None = None, group: ProcessGroup | None = None,
         tag: int = 0, group_dst: int | None = None) -> None:
    """Send ``tensor`` to rank ``dst`` (global; or ``group_dst``) and return once it is sent.

    Raises:
        ValueError: ``dst`` is this rank, or not a rank of ``group``.
    """
    if (rt := device_runtime(tensor)) is not None:  # device tensors: staged
        return staged_call(rt, send, locals())
    group = a.group_or_default(group)
    group_dst = a.canonical_rank(group, dst, group_dst)
    if a.not_in_group(group):
        a.check_single_tensor(tensor, "tensor")
        a.warn_not_in_group("send")
        return None
    a.check_not_self_rank(group, group_dst, "destination")
    work = _isend(tensor, None, group, tag, group_dst, async_op=False)
    if work is not None:
        work.wait()
    return None


@staged(reads=(), writes=("tensor",))
def recv(tensor: torch.Tensor, src: int | None = None, group: ProcessGroup | None = None,
         tag: int = 0, group_src: int | None = None) -> int:
    """Receive into ``tensor`` from rank ``src`` (global; or ``group_src``; any rank when
    neither is given).

    Returns:
        The sender's global rank; -1 on a rank outside ``group``.
    """
    if (rt := device_runtime(tensor)) is not None:  # device tensors: staged
        return staged_call(rt, recv, locals())
    work = _irecv(tensor, src, group, tag, group_src, async_op=False)
    if work is None:
        return -1
    work.wait()
    if src is None:
        group = a.group_or_default(group)
        if group_src is None:
            group_src = work._source_rank()
        a.check_not_self_rank(group, group_src, "source")
        src = groups.get_global_rank(group, group_src)
    return src


class P2POp:
    """One send or receive of a ``batch_isend_irecv`` batch.

    Args:
        op: ``isend`` or ``irecv`` (of this module).
        tensor: what to send, or where to receive.
        peer: the other rank (global); or ``group_peer`` (group rank).
        group: the group (the default one if None).
        tag: matches a send with a receive.
    """

    def __new__(cls, op: Callable[..., Any], tensor: torch.Tensor, peer: int | None = None,
                group: ProcessGroup | None = None, tag: int = 0,
                group_peer: int | None = None) -> P2POp:
        _check_op(op)
        a.check_single_tensor(tensor, "tensor")
        return object.__new__(cls)

    def __init__(self, op: Callable[..., Any], tensor: torch.Tensor, peer: int | None = None,
                 group: ProcessGroup | None = None, tag: int = 0,
                 group_peer: int | None = None) -> None:
        self.op = op
        self.tensor = tensor
        self.group = a.group_or_default(group)
        self.peer = a.canonical_rank(self.group, peer, group_peer, return_global=True)
        self.tag = tag
        self.group_peer = a.canonical_rank(self.group, peer, group_peer)

    def __repr__(self) -> str:
        me = groups.get_rank(self.group)
        name = self.op.__name__
        src, dst = (me, self.group_peer) if "send" in name else (self.group_peer, me)
        group_name = getattr(self.group, "group_name", "default_pg")
        return (f"P2POp({name} pg={group_name}, group_src={src}, group_dst={dst},  "
                f"{tuple(self.tensor.shape)}, {self.tensor.dtype})")


def _check_op(op: Any) -> None:
    if op not in (isend, irecv):
        raise ValueError("Invalid ``op``. Expected ``op`` to be of type "
                         "``torch.distributed.isend`` or ``torch.distributed.irecv``.")


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Start every send and receive of ``p2p_op_list``; returns their Works, in order.

    The order of sends and receives in the list does not matter (no deadlock), except between
    two ranks in one direction, where the n-th send matches the n-th receive.

    Raises:
        ValueError: an element is not a P2POp, or the ops use different groups.
    """
    if not isinstance(p2p_op_list, list) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type "
                         "``torch.distributed.P2POp``.")
    if p2p_op_list and not all(p.group == p2p_op_list[0].group for p in p2p_op_list):
        raise ValueError("All ops need to use the same group.")
    if p2p_op_list and (rt := device_runtime(*[p.tensor for p in p2p_op_list])) is not None:
        side = _nccl_ops.group_of(p2p_op_list[0].group)
        if side is not None:  # one NCCL group: separate calls on one stream could deadlock
            batched = _nccl_ops.batch(side, rt, [("send" if p.op is isend else "recv",
                                                  p.tensor, p.group_peer) for p in p2p_op_list])
            if batched is not None:
                return batched
    works = []
    for p in p2p_op_list:
        key = "group_dst" if p.op is isend else "group_src"
        work = p.op(p.tensor, group=p.group, tag=p.tag, **{key: p.group_peer})
        if work is not None:
            works.append(work)
    return works


__all__ = ["P2POp", "batch_isend_irecv", "irecv", "isend", "recv", "send"]

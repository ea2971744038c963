"""Collectives that autograd can differentiate: torch.distributed.nn.functional's API.

Each function runs the collective of ``ringtorch.distributed`` on a copy of its input (never in
place) and returns the result as a tensor with a ``grad_fn``; its backward is the matching
collective run on the gradients, so the gradient of a broadcast is a reduce to the source, of a
gather a scatter from the destination, of an all_gather a reduce_scatter, of an all_to_all the
all_to_all the other way round, of an all_reduce the same all_reduce. Every rank of the group
must call backward too (the backward is a collective), in the same order as the forwards.

Ranks named by ``src``/``dst`` are global ranks, as in ``ringtorch.distributed``. Where torch
compares them with the rank inside ``group`` (broadcast's backward, gather, scatter) this module
compares global with global, so subgroups whose ranks are not numbered from 0 work too; for
every group where both numberings agree the results are torch's. torch's FutureWarnings
pointing to ``torch.distributed._functional_collectives`` are not raised (that module works on
torch's groups; ringtorch.distributed._functional_collectives re-exports it for groups of
backend "ringtorch").
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd import Function

import ringtorch.distributed as dist
from ringtorch.distributed import ReduceOp, group

__all__ = ["all_gather", "all_reduce", "all_to_all", "all_to_all_single", "broadcast", "gather",
           "reduce", "reduce_scatter", "scatter"]

_WORLD = group.WORLD  # None: the default group, as torch's signatures show it


def _refuse_under_compile(name: str) -> None:
    if torch.compiler.is_compiling():
        raise RuntimeError(f"ringtorch.distributed.nn.functional.{name} is not supported under "
                           f"torch.compile.")


def broadcast(tensor: torch.Tensor, src: int, group: Any = _WORLD) -> torch.Tensor:
    """Return ``tensor`` of rank ``src`` on every rank (the input is left as it is).

    Backward: the gradients of every rank are summed into ``src``'s input gradient; the other
    ranks' inputs get zeros (they did not contribute).
    """
    _refuse_under_compile("broadcast")
    return _Broadcast.apply(src, group, tensor)


def gather(tensor: torch.Tensor, dst: int = 0, group: Any = _WORLD) -> tuple[torch.Tensor, ...]:
    """Return, on rank ``dst``, one tensor per rank of ``group`` holding that rank's ``tensor``;
    the other ranks get as many zero tensors.

    Backward: ``dst`` scatters the gradients of its outputs, rank i's input gets the i-th.
    """
    _refuse_under_compile("gather")
    return _Gather.apply(dst, group, tensor)


def scatter(tensors: list[torch.Tensor] | tuple[torch.Tensor, ...], src: int = 0,
            group: Any = _WORLD) -> torch.Tensor:
    """Return, on rank i of ``group``, the i-th tensor of ``tensors`` given by rank ``src``.

    Every rank passes a list of same-shaped tensors (only ``src``'s values are sent; the
    others give the shape). Backward: ``src`` gathers every rank's output gradient.
    """
    _refuse_under_compile("scatter")
    return _Scatter.apply(src, group, *tensors)


def reduce(tensor: torch.Tensor, dst: int, op: Any = ReduceOp.SUM,
           group: Any = _WORLD) -> torch.Tensor:
    """Return the reduction of every rank's ``tensor`` on rank ``dst`` (other ranks' results
    are unspecified, as in torch). Backward: ``dst``'s output gradient is broadcast to every
    rank's input."""
    _refuse_under_compile("reduce")
    return _Reduce.apply(dst, op, group, tensor)


def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor],
                   op: Any = ReduceOp.SUM, group: Any = _WORLD) -> torch.Tensor:
    """Reduce ``input_list`` element-wise across ranks and return element i on rank i (written
    into ``output`` too). Backward: the output gradients are all-gathered into the inputs'."""
    _refuse_under_compile("reduce_scatter")
    return _ReduceScatter.apply(op, group, output, *input_list)


def all_gather(tensor: torch.Tensor, group: Any = _WORLD) -> tuple[torch.Tensor, ...]:
    """Return every rank's ``tensor``, one per rank of ``group``. Backward: each rank's input
    gradient is the sum over ranks of the gradient of its own slot (a reduce_scatter)."""
    _refuse_under_compile("all_gather")
    return _AllGather.apply(group, tensor)


def all_to_all(output_tensor_list: list[torch.Tensor], input_tensor_list: list[torch.Tensor],
               group: Any = _WORLD) -> tuple[torch.Tensor, ...]:
    """Send ``input_tensor_list[j]`` to rank j; return (and fill) ``output_tensor_list``, whose
    i-th tensor came from rank i. Backward: the same exchange, the other way round."""
    _refuse_under_compile("all_to_all")
    return _AllToAll.apply(group, output_tensor_list, *input_tensor_list)


def all_to_all_single(output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None,
                      group: Any = _WORLD) -> torch.Tensor:
    """``all_to_all`` on dim 0 of one tensor, split by the given sizes (equal splits when
    None); returns ``output``. Backward: the exchange with the split sizes swapped."""
    _refuse_under_compile("all_to_all_single")
    return _AllToAllSingle.apply(group, output, output_split_sizes, input_split_sizes, input)


def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = _WORLD) -> torch.Tensor:
    """Return the reduction of every rank's ``tensor`` (the input is left as it is).

    Backward: the output gradients are all-reduced with the same ``op`` (with SUM, the
    gradient of the sum; torch does the same for the other ops).
    """
    _refuse_under_compile("all_reduce")
    return _AllReduce.apply(op, group, tensor)


# ---- the autograd Functions: forward is a collective, backward its transpose ----------------


class _Broadcast(Function):
    @staticmethod
    def forward(ctx: Any, src: int, group: Any, tensor: torch.Tensor) -> torch.Tensor:
        ctx.src, ctx.group = src, group
        out = tensor.clone()
        dist.broadcast(out, src, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        summed = _Reduce.apply(ctx.src, ReduceOp.SUM, ctx.group, grad)
        if dist.get_rank() != ctx.src:
            summed.zero_()
        return None, None, summed


class _Reduce(Function):
    @staticmethod
    def forward(ctx: Any, dst: int, op: Any, group: Any, tensor: torch.Tensor) -> torch.Tensor:
        ctx.dst, ctx.group = dst, group
        out = tensor.clone()
        dist.reduce(out, dst, op=op, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None, torch.Tensor]:
        return None, None, None, _Broadcast.apply(ctx.dst, ctx.group, grad)


class _Gather(Function):
    @staticmethod
    def forward(ctx: Any, dst: int, group: Any, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.dst, ctx.group = dst, group
        outs = [torch.zeros_like(tensor) for _ in range(dist.get_world_size(group=group))]
        dist.gather(tensor.contiguous(), outs if dist.get_rank() == dst else None, dst,
                    group=group)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        return None, None, _Scatter.apply(ctx.dst, ctx.group, *grads)


class _Scatter(Function):
    @staticmethod
    def forward(ctx: Any, src: int, group: Any, *tensors: torch.Tensor) -> torch.Tensor:
        ctx.src, ctx.group = src, group
        if any(t.size() != tensors[0].size() for t in tensors):
            raise ValueError(f"scatter needs tensors of one shape, got "
                             f"{[tuple(t.shape) for t in tensors]}")
        out = torch.zeros_like(tensors[0])
        sending = [t.contiguous() for t in tensors] if dist.get_rank() == src else None
        dist.scatter(out, sending, src, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return (None, None, *_Gather.apply(ctx.src, ctx.group, grad))


class _ReduceScatter(Function):
    @staticmethod
    def forward(ctx: Any, op: Any, group: Any, output: torch.Tensor,
                *inputs: torch.Tensor) -> torch.Tensor:
        ctx.group = group
        output = output.contiguous()
        dist.reduce_scatter(output, [t.contiguous() for t in inputs], op=op, group=group)
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        return (None, None, None, *_AllGather.apply(ctx.group, grad))


class _AllGather(Function):
    @staticmethod
    def forward(ctx: Any, group: Any, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.group = group
        tensor = tensor.contiguous()
        outs = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group=group))]
        dist.all_gather(outs, tensor, group=group)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[None, torch.Tensor]:
        # The transpose of all_gather is a summing reduce_scatter, which our backends have
        # (torch's gloo path emulates it with an all_to_all and a local sum).
        mine = torch.empty_like(grads[dist.get_rank(group=ctx.group)])
        return None, _ReduceScatter.apply(ReduceOp.SUM, ctx.group, mine, *grads)


class _AllToAll(Function):
    @staticmethod
    def forward(ctx: Any, group: Any, outputs: list[torch.Tensor],
                *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.group = group
        ctx.input_sizes = [t.size() for t in inputs]
        dist.all_to_all(outputs, [t.contiguous() for t in inputs], group=group)
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        back = [torch.empty(size, dtype=grads[0].dtype, device=grads[0].device)
                for size in ctx.input_sizes]
        return (None, None, *_AllToAll.apply(ctx.group, back, *grads))


class _AllToAllSingle(Function):
    @staticmethod
    def forward(ctx: Any, group: Any, output: torch.Tensor, output_split_sizes: list[int] | None,
                input_split_sizes: list[int] | None, input: torch.Tensor) -> torch.Tensor:
        ctx.group = group
        ctx.input_size = input.size()
        ctx.splits = (output_split_sizes, input_split_sizes)
        dist.all_to_all_single(output, input, output_split_sizes=output_split_sizes,
                               input_split_sizes=input_split_sizes, group=group)
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        back = torch.empty(ctx.input_size, dtype=grad.dtype, device=grad.device)
        received, sent = ctx.splits  # the gradient travels the other way round
        return (None, None, None, None,
                _AllToAllSingle.apply(ctx.group, back, sent, received, grad.contiguous()))


class _AllReduce(Function):
    @staticmethod
    def forward(ctx: Any, op: Any, group: Any, tensor: torch.Tensor) -> torch.Tensor:
        ctx.op, ctx.group = op, group
        out = tensor.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, op=op, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, torch.Tensor]:
        return None, None, _AllReduce.apply(ctx.op, ctx.group, grad)

"""torch's deprecated and coalesced collectives, kept for the programs that still call them.

``all_gather_into_tensor`` and ``reduce_scatter_tensor`` are torch 2.13's old names of
``all_gather_single`` and ``reduce_scatter_single`` (they warn, as torch's do);
``all_reduce_coalesced`` and ``all_gather_coalesced`` run several tensors as one collective
and, with ``async_op``, return a Future as torch does; ``reduce_op`` is the old ReduceOp.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from typing_extensions import deprecated

from ringtorch.collectives.options import AllgatherOptions, AllreduceCoalescedOptions
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.collectives.reduce_op import RedOpType, ReduceOp
from ringtorch.collectives.work import Work
from ringtorch.distributed import _args as a
from ringtorch.distributed._device_staging import device_runtime, staged, staged_call
from ringtorch.distributed.ops import (
    _real,
    all_gather_single,
    reduce_scatter_single,
    supports_complex,
)


@deprecated("`torch.distributed.all_reduce_coalesced` will be deprecated. If you must use it, "
            "please revisit our documentation later at "
            "https://pytorch.org/docs/main/distributed.html#collective-functions",
            category=FutureWarning)
@staged(reads=("tensors",), writes=("tensors",))
def all_reduce_coalesced(tensors: Any, op: Any = ReduceOp.SUM,
                         group: ProcessGroup | None = None, async_op: bool = False) -> Any:
    """All-reduce several tensors of one dtype in one collective (deprecated in torch).

    Returns:
        With ``async_op``, a Future (as torch returns); otherwise None.
    """
    if (rt := device_runtime(tensors)) is not None:  # device tensors: staged
        return staged_call(rt, all_reduce_coalesced, locals())
    if _is_buffer_like(tensors):
        tensors = [tensors]
    ts = a.check_tensor_list(tensors, "tensor")
    a.ensure_same_dtype(ts)
    if a.not_in_group(group):
        a.warn_not_in_group("all_reduce_coalesced")
        return None
    if any(t.is_complex() for t in ts) and not supports_complex(op):
        raise ValueError(f"all_reduce does not support {op} on complex tensors")
    group = a.group_or_default(group)
    opts = AllreduceCoalescedOptions(reduceOp=op, asyncOp=async_op)
    work = group.allreduce_coalesced([_real(t) for t in ts], opts)
    if async_op:
        return work.get_future()
    work.wait()
    return None


@deprecated("`torch.distributed.all_gather_into_tensor` is deprecated. Please use "
            "`torch.distributed.all_gather_single` instead.", category=FutureWarning)
def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                           group: ProcessGroup | None = None,
                           async_op: bool = False) -> Work | None:
    """``all_gather_single`` under its older name (deprecated in torch 2.13, as here)."""
    return all_gather_single(output_tensor, input_tensor, group, async_op)


@deprecated("`torch.distributed._all_gather_base` is a private function and will be deprecated. "
            "Please use `torch.distributed.all_gather_single` instead.", category=FutureWarning)
def _all_gather_base(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                     group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    return all_gather_single(output_tensor, input_tensor, group, async_op)


@deprecated("`torch.distributed.all_gather_coalesced` will be deprecated. If you must use it, "
            "please revisit our documentation later at "
            "https://pytorch.org/docs/main/distributed.html#collective-functions",
            category=FutureWarning)
@staged(reads=("input_tensor_list",), writes=("output_tensor_lists",))
def all_gather_coalesced(output_tensor_lists: list[list[torch.Tensor]],
                         input_tensor_list: list[torch.Tensor],
                         group: ProcessGroup | None = None, async_op: bool = False) -> Any:
    """Several all_gathers in one collective (deprecated in torch); ``async_op`` gives a
    Future, as in torch."""
    if (rt := device_runtime(output_tensor_lists, input_tensor_list)) is not None:  # device tensors: staged
        return staged_call(rt, all_gather_coalesced, locals())
    if a.not_in_group(group):
        a.warn_not_in_group("all_gather_coalesced")
        return None
    ins = a.check_tensor_list(input_tensor_list, "input_tensor_list")
    a.ensure_same_dtype(ins)
    if not isinstance(output_tensor_lists, list):
        raise TypeError("Invalid function argument: output_tensor_lists should be a list")
    outs = []
    for lst in output_tensor_lists:
        checked = a.check_tensor_list(lst, "output_tensor_lists")
        a.ensure_same_dtype(checked)
        outs.append([_real(t) for t in checked])
    group = a.group_or_default(group)
    work = group.allgather_coalesced(outs, [_real(t) for t in ins],
                                     AllgatherOptions(asyncOp=async_op))
    if async_op:
        return work.get_future()
    work.wait()
    return None


@deprecated("`torch.distributed.reduce_scatter_tensor` is deprecated. Please use "
            "`torch.distributed.reduce_scatter_single` instead.", category=FutureWarning)
def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op: Any = ReduceOp.SUM,
                          group: ProcessGroup | None = None,
                          async_op: bool = False) -> Work | None:
    """``reduce_scatter_single`` under its older name (deprecated in torch 2.13, as here)."""
    return reduce_scatter_single(output, input, op, group, async_op)


@deprecated("`torch.distributed._reduce_scatter_base` is a private function and will be "
            "deprecated. Please use `torch.distributed.reduce_scatter_single` instead.",
            category=FutureWarning)
def _reduce_scatter_base(output: torch.Tensor, input: torch.Tensor, op: Any = ReduceOp.SUM,
                         group: ProcessGroup | None = None,
                         async_op: bool = False) -> Work | None:
    return reduce_scatter_single(output, input, op, group, async_op)


def _is_buffer_like(obj: Any) -> bool:
    from ringtorch import _buffers

    return _buffers.is_buffer(obj)


class _ReduceOpAlias:
    """``reduce_op``: the deprecated spelling of ReduceOp (attribute access warns)."""

    def __init__(self) -> None:
        for name, member in RedOpType.__members__.items():
            object.__setattr__(self, name, member)
        object.__setattr__(self, "__members__", RedOpType.__members__)

    def __getattribute__(self, key: str) -> Any:
        warnings.warn("`torch.distributed.reduce_op` is deprecated, please use "
                      "`torch.distributed.ReduceOp` instead", FutureWarning, stacklevel=2)
        return object.__getattribute__(self, key)


reduce_op = _ReduceOpAlias()


__all__ = [
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_reduce_coalesced",
    "reduce_op",
    "reduce_scatter_tensor",
]

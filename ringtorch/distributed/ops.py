"""The collectives of ringtorch.distributed: torch's functions, arguments, defaults and errors.

Each function checks its arguments as torch does (_args.py), picks the group (the default
one for None), translates ``src``/``dst`` (global ranks) or ``group_src``/``group_dst``
(group ranks), and calls the group's ProcessGroup method. ``async_op=True`` returns the
Work at once; otherwise the call returns when the operation is done (a synchronous call on an
idle group runs on this thread). A rank outside ``group`` gets torch's warning and None.
Tensors may be torch CPU tensors of any dtype or NumPy arrays (results land in the array).
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from typing import Any

import torch

from ringtorch.collectives.options import (
    AllgatherOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.collectives.reduce_op import ReduceOp
from ringtorch.collectives.work import Work
from ringtorch.distributed import _args as a
from ringtorch.distributed import _sparse, groups
from ringtorch.distributed._backend import Backend
from ringtorch.distributed._device_staging import device_runtime, staged, staged_call
from ringtorch.distributed._world import GroupMember

_COMPLEX_DENIED = (ReduceOp.MAX, ReduceOp.MIN, ReduceOp.PRODUCT, ReduceOp.BAND, ReduceOp.BOR,
                   ReduceOp.BXOR)


def supports_complex(reduceOp: Any) -> bool:
    """Whether ``reduceOp`` has a meaning on complex tensors (MAX, MIN, PRODUCT and the
    bitwise ops do not)."""
    return reduceOp not in _COMPLEX_DENIED


_OPTIONS: dict[tuple[Any, ...], Any] = {}


def _options(cls: Any, **fields: Any) -> Any:
    """``cls(**fields)``, shared between calls: options are frozen, so one object per distinct
    set of fields is enough (building a dataclass costs about a microsecond per call)."""
    key = (cls, *fields.items())
    try:
        found = _OPTIONS.get(key)
    except TypeError:  # an unhashable field (a PREMUL_SUM factor tensor): build it
        return cls(**fields)
    if found is None:
        found = cls(**fields)
        if len(_OPTIONS) < 4096:
            _OPTIONS[key] = found
    return found


def _reduce_options(cls: Any, op: Any, async_op: bool) -> Any:
    """``_options(cls, reduceOp=op, asyncOp=async_op)`` under a shorter key: the hot path of
    a small all_reduce, where building the general key costs a third of a microsecond."""
    key = (cls, op, async_op)
    try:
        return _OPTIONS[key]
    except KeyError:
        found = _options(cls, reduceOp=op, asyncOp=async_op)
        if len(_OPTIONS) < 4096:
            _OPTIONS[key] = found
        return found
    except TypeError:  # an unhashable op (a PREMUL_SUM factor tensor): build it
        return cls(reduceOp=op, asyncOp=async_op)


def _finish(work: Work | None, async_op: bool) -> Work | None:
    if async_op:
        return work
    if work is not None:
        work.wait()
    return None


def _real(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(t) if t.is_complex() else t


@staged(reads=("tensor",), writes=("tensor",))
def broadcast(tensor: torch.Tensor, src: int | None = None, group: ProcessGroup | None = None,
              async_op: bool = False, group_src: int | None = None) -> Work | None:
    """Copy ``tensor`` from rank ``src`` (global) or ``group_src`` into every rank's ``tensor``.

    Returns:
        The Work with ``async_op``; otherwise None (also None on a rank outside ``group``).
    """
    if (rt := device_runtime(tensor)) is not None:  # device tensors: staged
        return staged_call(rt, broadcast, locals())
    group = a.group_or_default(group)
    group_src = a.canonical_rank(group, src, group_src)
    t = a.check_single_tensor(tensor, "tensor")
    if a.not_in_group(group):
        a.warn_not_in_group("broadcast")
        return None
    a.check_outputs_writable(tensor, "tensor")
    opts = _options(BroadcastOptions, rootRank=group_src, asyncOp=async_op)
    return _finish(group.broadcast([_real(t)], opts), async_op)


@staged(reads=("tensor",), writes=("tensor",))
def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: ProcessGroup | None = None,
               async_op: bool = False) -> Work | None:
    """Reduce ``tensor`` across every rank with ``op``, in place; every rank gets the same
    bits (the reduction runs in a fixed order).

    Raises:
        ValueError: ``op`` is MAX/MIN/PRODUCT/BAND/BOR/BXOR and ``tensor`` is complex.
        RuntimeError: ``op`` has no meaning for the dtype (BAND on floats, AVG on ints).
    """
    if (rt := device_runtime(tensor)) is not None:  # device tensors: staged
        return staged_call(rt, all_reduce, locals())
    t = a.check_single_tensor(tensor, "tensor")
    if a.not_in_group(group):
        a.warn_not_in_group("all_reduce")
        return None
    a.check_outputs_writable(tensor, "tensor")
    if t.is_complex():
        if not supports_complex(op):
            raise ValueError(f"all_reduce does not support {op} on complex tensors")
        t = torch.view_as_real(t)
    group = a.group_or_default(group)
    opts = _reduce_options(AllreduceOptions, op, async_op)
    # the group refuses a sparse tensor (NotImplementedError): catching that spares every
    # dense call a layout check
    try:
        work = group.allreduce([t], opts)
    except NotImplementedError:
        if not t.is_sparse:
            raise
        return _all_reduce_sparse(t, op, group, async_op)
    return _finish(work, async_op)


def _all_reduce_sparse(t: torch.Tensor, op: Any, group: ProcessGroup | None,
                       async_op: bool) -> Work | None:
    """A sparse COO tensor's all_reduce (SUM only, as gloo's), over all-gathers; it is done
    when this returns, so ``async_op`` gets a completed Work."""
    _sparse.check_op(op)
    group = a.group_or_default(group)

    def gather(out: torch.Tensor, inp: torch.Tensor) -> None:
        group.all_gather_single(out, inp, AllgatherOptions(asyncOp=False)).wait()

    _sparse.all_reduce(t, group.size(), gather)
    if not async_op:
        return None
    work = Work("allreduce", -1, None, [t], group.group_name)
    work.run()
    return work


@staged(reads=("tensor",), writes=("tensor",))
def reduce(tensor: torch.Tensor, dst: int | None = None, op: Any = ReduceOp.SUM,
           group: ProcessGroup | None = None, async_op: bool = False,
           group_dst: int | None = None) -> Work | None:
    """Reduce ``tensor`` across ranks into rank ``dst``'s (global; or ``group_dst``) tensor.

    Only ``dst``'s tensor is defined afterwards (others may hold partial results)."""
    if (rt := device_runtime(tensor)) is not None:  # device tensors: staged
        return staged_call(rt, reduce, locals())
    group = a.group_or_default(group)
    group_dst = a.canonical_rank(group, dst, group_dst)
    t = a.check_single_tensor(tensor, "tensor")
    if a.not_in_group(group):
        a.warn_not_in_group("reduce")
        return None
    a.check_outputs_writable(tensor, "tensor")
    if t.is_complex():
        if not supports_complex(op):
            raise ValueError(f"reduce does not support {op} on complex tensors")
        t = torch.view_as_real(t)
    opts = _options(ReduceOptions, reduceOp=op, rootRank=group_dst, asyncOp=async_op)
    return _finish(group.reduce([t], opts), async_op)


@staged(reads=("tensor",), writes=("tensor_list",))
def all_gather(tensor_list: list[torch.Tensor], tensor: torch.Tensor,
               group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Gather every rank's ``tensor`` into every rank's ``tensor_list`` (one per rank, in
    group-rank order). The list's tensors may differ in size (ringtorch sends uneven parts;
    gloo refuses them)."""
    if (rt := device_runtime(tensor_list, tensor)) is not None:  # device tensors: staged
        return staged_call(rt, all_gather, locals())
    outs = a.check_tensor_list(tensor_list, "tensor_list")
    t = a.check_single_tensor(tensor, "tensor")
    a.ensure_same_dtype(outs, t)
    if a.not_in_group(group):
        a.warn_not_in_group("all_gather")
        return None
    a.check_outputs_writable(tensor_list, "tensor_list")
    group = a.group_or_default(group)
    opts = _options(AllgatherOptions, asyncOp=async_op)
    return _finish(group.allgather([[_real(o) for o in outs]], [_real(t)], opts), async_op)


@staged(reads=("input_tensor",), writes=("output_tensor",))
def all_gather_single(output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                      group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Gather every rank's ``input_tensor`` into ``output_tensor``, concatenated or stacked
    along the first dimension (same size on every rank)."""
    if (rt := device_runtime(output_tensor, input_tensor)) is not None:  # device tensors: staged
        return staged_call(rt, all_gather_single, locals())
    inp = a.check_single_tensor(input_tensor, "input_tensor")
    out = a.check_single_tensor(output_tensor, "output_tensor")
    if a.not_in_group(group):
        a.warn_not_in_group("all_gather_single")
        return None
    a.check_outputs_writable(output_tensor, "output_tensor")
    group = a.group_or_default(group)
    opts = _options(AllgatherOptions, asyncOp=async_op)
    return _finish(group.all_gather_single(_real(out), _real(inp), opts), async_op)


def _validate_output_list_for_rank(my_rank: int, dst: int, gather_list: Any) -> None:
    if dst == my_rank:
        if not gather_list:
            raise ValueError("Argument ``gather_list`` must be specified on destination rank.")
    elif gather_list:
        raise ValueError("Argument ``gather_list`` must NOT be specified on non-destination "
                         "ranks.")


@staged(reads=("tensor",), writes=("gather_list",))
def gather(tensor: torch.Tensor, gather_list: list[torch.Tensor] | None = None,
           dst: int | None = None, group: ProcessGroup | None = None, async_op: bool = False,
           group_dst: int | None = None) -> Work | None:
    """Gather every rank's ``tensor`` into ``gather_list`` on rank ``dst`` (global rank 0 by
    default); other ranks pass no list."""
    if (rt := device_runtime(tensor, gather_list)) is not None:  # device tensors: staged
        return staged_call(rt, gather, locals())
    t = a.check_single_tensor(tensor, "tensor")
    outs = a.check_tensor_list(gather_list, "gather_list") if gather_list else []
    a.ensure_same_dtype(t, outs)
    group = a.group_or_default(group)
    if a.not_in_group(group):
        a.warn_not_in_group("gather")
        return None
    if dst is None and group_dst is None:
        dst = 0
    group_dst = a.canonical_rank(group, dst, group_dst)
    _validate_output_list_for_rank(group.rank(), group_dst, outs)
    a.check_outputs_writable(gather_list or [], "gather_list")
    output = [[_real(o) for o in outs]] if group_dst == group.rank() else []
    opts = GatherOptions(rootRank=group_dst, asyncOp=async_op)
    return _finish(group.gather(output, [_real(t)], opts), async_op)


@staged(reads=("scatter_list",), writes=("tensor",))
def scatter(tensor: torch.Tensor, scatter_list: list[torch.Tensor] | None = None,
            src: int | None = None, group: ProcessGroup | None = None, async_op: bool = False,
            group_src: int | None = None) -> Work | None:
    """Send ``scatter_list[i]`` from rank ``src`` (global rank 0 by default) into rank i's
    ``tensor``; other ranks pass no list (or an empty one)."""
    if (rt := device_runtime(tensor, scatter_list)) is not None:  # device tensors: staged
        return staged_call(rt, scatter, locals())
    t = a.check_single_tensor(tensor, "tensor")
    ins = a.check_tensor_list(scatter_list, "scatter_list") if scatter_list else []
    a.ensure_same_dtype(t, ins)
    group = a.group_or_default(group)
    if src is None and group_src is None:
        src = 0
    group_src = a.canonical_rank(group, src, group_src)
    if a.not_in_group(group):
        a.warn_not_in_group("scatter")
        return None
    a.check_outputs_writable(tensor, "tensor")
    if group_src == group.rank():
        if not ins:
            raise ValueError("Argument ``scatter_list`` must be specified on source rank.")
        inputs, outputs = [[_real(i) for i in ins]], [_real(t)]
    else:
        if ins:
            raise ValueError("Argument ``scatter_list`` must NOT be specified on non-source "
                             "ranks.")
        inputs, outputs = [], [_real(t)]
    opts = ScatterOptions(rootRank=group_src, asyncOp=async_op)
    return _finish(group.scatter(outputs, inputs, opts), async_op)


@staged(reads=("input_list",), writes=("output",))
def reduce_scatter(output: torch.Tensor, input_list: list[torch.Tensor], op: Any = ReduceOp.SUM,
                   group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Reduce ``input_list`` element-wise across ranks; rank i's ``output`` gets element i."""
    if (rt := device_runtime(output, input_list)) is not None:  # device tensors: staged
        return staged_call(rt, reduce_scatter, locals())
    out = a.check_single_tensor(output, "output")
    ins = a.check_tensor_list(input_list, "input_list")
    a.ensure_same_dtype(out, ins)
    if a.not_in_group(group):
        a.warn_not_in_group("reduce_scatter")
        return None
    a.check_outputs_writable(output, "output")
    _check_complex_op(op, [out, *ins], "reduce_scatter")
    group = a.group_or_default(group)
    opts = _options(ReduceScatterOptions, reduceOp=op, asyncOp=async_op)
    return _finish(group.reduce_scatter([_real(out)], [[_real(i) for i in ins]], opts),
                   async_op)


@staged(reads=("input",), writes=("output",))
def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, op: Any = ReduceOp.SUM,
                          group: ProcessGroup | None = None,
                          async_op: bool = False) -> Work | None:
    """Reduce ``input`` (world size x ``output``, concatenated or stacked) across ranks; rank
    i's ``output`` gets slice i."""
    if (rt := device_runtime(output, input)) is not None:  # device tensors: staged
        return staged_call(rt, reduce_scatter_single, locals())
    out = a.check_single_tensor(output, "output")
    inp = a.check_single_tensor(input, "input")
    if a.not_in_group(group):
        a.warn_not_in_group("reduce_scatter_single")
        return None
    a.check_outputs_writable(output, "output")
    _check_complex_op(op, [out, inp], "reduce_scatter")
    group = a.group_or_default(group)
    opts = _options(ReduceScatterOptions, reduceOp=op, asyncOp=async_op)
    return _finish(group.reduce_scatter_single(_real(out), _real(inp), opts), async_op)


@staged(reads=("input",), writes=("output",))
def all_to_all_single(output: torch.Tensor, input: torch.Tensor,
                      output_split_sizes: list[int] | None = None,
                      input_split_sizes: list[int] | None = None,
                      group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Split ``input`` along dim 0 (``input_split_sizes``, or evenly), send part j to rank j,
    and concatenate what each rank sends here into ``output`` (``output_split_sizes``)."""
    if (rt := device_runtime(output, input)) is not None:  # device tensors: staged
        return staged_call(rt, all_to_all_single, locals())
    if a.not_in_group(group):
        a.warn_not_in_group("all_to_all_single")
        return None
    out = a.check_single_tensor(output, "output")
    inp = a.check_single_tensor(input, "input")
    a.ensure_same_dtype(out, inp)
    a.check_outputs_writable(output, "output")
    group = a.group_or_default(group)
    opts = AllToAllOptions(asyncOp=async_op)
    work = group.alltoall_base(_real(out), _real(inp), list(output_split_sizes or []),
                               list(input_split_sizes or []), opts)
    return _finish(work, async_op)


@staged(reads=("input_tensor_list",), writes=("output_tensor_list",))
def all_to_all(output_tensor_list: list[torch.Tensor], input_tensor_list: list[torch.Tensor],
               group: ProcessGroup | None = None, async_op: bool = False) -> Work | None:
    """Send ``input_tensor_list[j]`` to rank j; receive rank j's into
    ``output_tensor_list[j]``."""
    if (rt := device_runtime(output_tensor_list, input_tensor_list)) is not None:  # device tensors: staged
        return staged_call(rt, all_to_all, locals())
    if a.not_in_group(group):
        a.warn_not_in_group("all_to_all")
        return None
    outs = a.check_tensor_list(output_tensor_list, "output_tensor_list")
    ins = a.check_tensor_list(input_tensor_list, "input_tensor_list")
    a.ensure_same_dtype(outs, ins)
    a.check_outputs_writable(output_tensor_list, "output_tensor_list")
    group = a.group_or_default(group)
    opts = AllToAllOptions(asyncOp=async_op)
    return _finish(group.alltoall([_real(o) for o in outs], [_real(i) for i in ins], opts),
                   async_op)


def barrier(group: ProcessGroup | None = GroupMember.WORLD, async_op: bool = False,
            device_ids: list[int] | None = None,
            timeout: timedelta | None = None) -> Work | None:
    """Return once every rank of ``group`` has entered the barrier (``timeout`` overrides
    the group's)."""
    group = a.group_or_default(group)
    if a.not_in_group(group):
        a.warn_not_in_group("barrier")
        return None
    if timeout is not None:
        a.check_timeout(timeout)
    opts = BarrierOptions(device_ids=list(device_ids or []), timeout=timeout, asyncOp=async_op)
    return _finish(group.barrier(opts), async_op)


def monitored_barrier(group: ProcessGroup | None = GroupMember.WORLD, timeout: Any = None,
                      wait_all_ranks: bool = False) -> None:
    """A barrier that names the ranks that did not arrive within ``timeout``.

    Every rank but 0 reports to rank 0, which waits for each (``wait_all_ranks``: for all,
    then names every missing one) and releases them.

    Raises:
        DistBackendError: on rank 0, "[Rank 0]: Rank 2 failed to pass monitoredBarrier in
            1000 ms" ("Ranks 1, 2 ..." with ``wait_all_ranks``); on the others, that rank 0
            reported a failure or could not be reached.
        ValueError: the group's backend is not ringtorch's native ("gloo") backend.
    """
    if a.not_in_group(group):
        a.warn_not_in_group("monitored_barrier")
        return None
    # torch refuses backends other than gloo; ringtorch's native backend is gloo's stand-in
    # under every name it has (and "undefined", what a group made without a backend reports).
    if groups.get_backend(group) not in (Backend.GLOO, Backend.UNDEFINED, "native", "ringtorch"):
        raise ValueError("monitored_barrier is only implemented for GLOO backend.")
    if timeout is None:
        timeout = groups.default_pg_timeout
    elif isinstance(timeout, float):
        warnings.warn(f"Please specify timeout arg as a timedelta. Converting current value of "
                      f"{timeout} assuming it represents seconds", stacklevel=2)
        timeout = timedelta(seconds=timeout)
    a.check_timeout(timeout)
    pg = a.group_or_default(group)
    return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def _check_complex_op(op: Any, tensors: list[torch.Tensor], name: str) -> None:
    if any(t.is_complex() for t in tensors) and not supports_complex(op):
        raise ValueError(f"{name} does not support {op} on complex tensors")


__all__ = [
    "all_gather",
    "all_gather_single",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "gather",
    "monitored_barrier",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "scatter",
    "supports_complex",
]

"""Argument handling shared by the facade's operations, with torch's checks and messages.

torch checks a collective's arguments in Python before its ProcessGroup sees them: tensors
must be tensors (ringtorch also takes NumPy arrays), lists must be lists, dtypes must agree,
``src``/``dst`` are global ranks unless ``group_src``/``group_dst`` give group ranks, and a
rank outside the group gets a warning and ``None``. These helpers do the same, in the same
order, with the same words.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import torch

from ringtorch import _buffers
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.distributed import groups
from ringtorch.distributed._torch_world import engine_of
from ringtorch.distributed._world import GroupMember, is_non_member


def group_or_default(group: Any) -> Any:
    """The engine's group to run on: ``group``'s (torch's object for it, as DeviceMesh and
    ``torch.distributed.new_group`` hand out, stands for it), or the default group for None
    and ``group.WORLD``."""
    if group is None or group is GroupMember.WORLD:
        return groups._get_default_group()
    return engine_of(group)


def not_in_group(group: Any) -> bool:
    """Whether this rank got NON_GROUP_MEMBER for ``group``."""
    return group is not None and is_non_member(group)


def warn_not_in_group(op_name: str) -> None:
    """torch's warning for an operation called on a group this rank is not in."""
    world = GroupMember.WORLD
    global_rank = -1 if world is None else world.rank()
    warnings.warn(f"Running {op_name} on global rank {global_rank} which does not belong to "
                  f"the given group.", stacklevel=3)


def check_single_tensor(param: Any, name: str) -> torch.Tensor:
    """``param`` as a tensor (NumPy arrays are wrapped, sharing memory).

    Raises:
        TypeError: torch's message, naming the parameter.
    """
    if type(param) is torch.Tensor:
        return param
    if not _buffers.is_buffer(param):
        raise TypeError(f"""Invalid function argument. Expected parameter `{name}` of type torch.Tensor
             but got {type(param)} instead.""")
    return _buffers.as_tensor(param)


def check_tensor_list(param: Any, name: str) -> list[torch.Tensor]:
    """``param`` as a list of tensors.

    Raises:
        TypeError: torch's message, naming the parameter.
    """
    if not isinstance(param, list):
        raise TypeError(f"""Invalid function argument. Expected parameter `{name}` of type List[torch.Tensor]
             but got {type(param)} instead.""")
    if not all(_buffers.is_buffer(p) for p in param):
        raise TypeError(f"""Invalid function argument. Expected parameter `{name}` of type List[torch.Tensor]
             but got {type(param)} with elements of type {[type(p) for p in param]}.""")
    return [_buffers.as_tensor(p) for p in param]


def check_outputs_writable(objs: Any, name: str) -> None:
    """NumPy outputs must be able to take the results (see _buffers.check_writable)."""
    if type(objs) is torch.Tensor:
        return
    for obj in objs if isinstance(objs, list) else [objs]:
        _buffers.check_writable(obj, name)


def ensure_same_dtype(*tensors: Any) -> None:
    """Every tensor has one dtype (a complex one may meet its real element type).

    Raises:
        ValueError: torch's message.
    """
    last = None
    for t in itertools.chain.from_iterable(x if isinstance(x, list) else (x,) for x in tensors):
        dtype = t.dtype
        if dtype.is_complex:
            dtype = torch.float32 if dtype == torch.complex64 else torch.complex128
        if last is None:
            last = dtype
        elif last != dtype:
            raise ValueError(f"Invalid usage of tensors with different dtypesFound {last} and  "
                             f"{t.dtype}")


def canonical_rank(group: Any, global_rank: int | None, group_rank: int | None,
                   return_global: bool = False) -> Any:
    """The group rank (or, with ``return_global``, the global rank) meant by a call that
    gives either ``src``/``dst`` (global) or ``group_src``/``group_dst`` (group).

    Raises:
        ValueError: both or neither are given, or the rank is not in ``group``.
    """
    if group_rank is not None:
        if global_rank is not None:
            raise ValueError("Can't specify both group_rank and global_rank")
        if is_non_member(group):
            return group_rank
        return groups.get_global_rank(group, group_rank) if return_global else group_rank
    if global_rank is None:
        raise ValueError("Must specify global_rank or group_rank")
    if return_global or is_non_member(group):
        return global_rank
    return groups.get_group_rank(group, global_rank)


def check_not_self_rank(group: ProcessGroup, rank: int, rank_type: str) -> None:
    """Blocking send/recv to oneself would wait forever: torch refuses it."""
    if group.rank() == rank:
        raise ValueError(f"Invalid {rank_type} rank: {rank_type} rank should not be the same as "
                         f"the rank of the current process.")


def check_timeout(timeout: Any) -> None:
    """A timeout must be a ``timedelta``."""
    groups._check_valid_timeout(timeout)


__all__ = [
    "canonical_rank",
    "check_not_self_rank",
    "check_outputs_writable",
    "check_single_tensor",
    "check_tensor_list",
    "check_timeout",
    "ensure_same_dtype",
    "group_or_default",
    "not_in_group",
    "warn_not_in_group",
]

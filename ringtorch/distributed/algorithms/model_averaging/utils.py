"""Average a model's parameters over a group with one flat all-reduce (torch's ``utils``).

The parameters are copied into one contiguous buffer (extra memory the size of the parameters),
divided by the group size, summed, and copied back in place. A rank outside the group does
nothing, as torch's does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ringtorch import distributed as dist

__all__ = ["average_parameters", "average_parameters_or_parameter_groups",
           "get_params_to_average"]


def average_parameters(params: Iterator[torch.nn.Parameter], process_group: Any) -> None:
    """Replace each parameter by its mean over ``process_group`` (None: the default group)."""
    group = process_group if process_group is not None else dist.group.WORLD
    if isinstance(group, int) and group == dist.GroupMember.NON_GROUP_MEMBER:
        return  # this rank is not in the group (new_group gave it NON_GROUP_MEMBER)
    params = list(params)
    if not params:
        return
    flat = torch.cat([p.data.reshape(-1) for p in params])
    flat /= dist.get_world_size(group)
    dist.all_reduce(flat, group=group)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.data.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def get_params_to_average(params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]]
                          ) -> list[torch.nn.Parameter]:
    """The parameters (of a model, or of an optimizer's parameter groups) that have a gradient.

    Raises:
        NotImplementedError: an item is neither a Parameter nor a parameter group dict.
    """
    chosen = []
    for item in params:
        if isinstance(item, torch.nn.Parameter):
            if item.grad is not None:
                chosen.append(item)
        elif isinstance(item, dict):
            chosen.extend(p for p in item["params"] if p.grad is not None)
        else:
            raise NotImplementedError(f"Parameter input of type {type(item)} is not supported")
    return chosen


def average_parameters_or_parameter_groups(
        params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
        process_group: Any) -> None:
    """Average the parameters of a model or of an optimizer's parameter groups."""
    average_parameters(iter(get_params_to_average(params)), process_group)

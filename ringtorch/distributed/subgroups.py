"""Subgroup helpers: many ``new_group`` calls at once (torch's ``new_subgroups`` family).

Like ``new_group``, every rank of the default group calls them with the same arguments;
each returns the subgroup this rank belongs to and the list of every subgroup.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.distributed._torch_world import engine_of
from ringtorch.distributed.groups import (
    _get_default_group,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    new_group,
)


def new_subgroups(group_size: int | None = None, group: ProcessGroup | None = None,
                  timeout: timedelta | None = None, backend: str | None = None,
                  pg_options: Any | None = None,
                  group_desc: str | None = None) -> tuple[Any, list[Any]]:
    """Split the world into consecutive subgroups of ``group_size`` ranks.

    Returns:
        (the subgroup holding this rank, every subgroup).

    Raises:
        ValueError: ``group_size`` is missing (there are no CUDA devices to count), not
            positive, larger than the world, or does not divide it.
    """
    if group_size is None:
        raise ValueError("Default group size only takes effect when CUDA is available.If your "
                         "subgroup using a backend that does not depend on CUDA,please pass in "
                         "'group_size' correctly.")
    if group_size <= 0:
        raise ValueError(f"The arg 'group_size' ({group_size}) must be positive")
    world_size = get_world_size(group=group)
    if world_size < group_size:
        raise ValueError(f"The arg 'group_size' ({group_size}) must not exceed the world size "
                         f"({world_size})")
    if world_size % group_size != 0:
        raise ValueError(f"The world size ({world_size}) must be divisible by '{group_size=}'")
    ranks = get_process_group_ranks(group=group)
    chunks = [ranks[i:i + group_size] for i in range(0, len(ranks), group_size)]
    return new_subgroups_by_enumeration(chunks, timeout=timeout, backend=backend,
                                        pg_options=pg_options, group_desc=group_desc)


def new_subgroups_by_enumeration(ranks_per_subgroup_list: list[list[int]],
                                 timeout: timedelta | None = None, backend: str | None = None,
                                 pg_options: Any | None = None,
                                 group_desc: str | None = None) -> tuple[Any, list[Any]]:
    """Create one subgroup per list of global ranks (the lists must not overlap).

    Returns:
        (the subgroup holding this rank or None, every subgroup).

    Raises:
        ValueError: the list is empty, or a rank appears in two subgroups.
    """
    if ranks_per_subgroup_list is None or len(ranks_per_subgroup_list) == 0:
        raise ValueError("The arg 'ranks_per_subgroup_list' cannot be empty")
    subgroups: list[Any] = []
    current = None
    owner: dict[int, list[int]] = {}
    my_rank = get_rank()
    for ranks in ranks_per_subgroup_list:
        subgroup = new_group(ranks=ranks, timeout=timeout, backend=backend,
                             pg_options=pg_options, group_desc=group_desc)
        subgroups.append(subgroup)
        for r in ranks:
            if r in owner:
                raise ValueError(f"Rank {r} has appeared in both subgroup {owner[r]} and {ranks}")
            owner[r] = ranks
            if r == my_rank:
                current = subgroup
    return current, subgroups


def split_group(parent_pg: ProcessGroup | None = None, split_ranks: list[list[int]] | None = None,
                timeout: timedelta | None = None, pg_options: Any | None = None,
                group_desc: str | None = None, backend: str | None = None) -> Any:
    """Split the default group into disjoint subgroups; returns this rank's (None if none).

    Every rank of the default group calls it with the same ``split_ranks`` (global ranks).

    Raises:
        ValueError: ``split_ranks`` is empty or its lists overlap; ``parent_pg`` is not the
            default group (ringtorch splits the default group only).
    """
    if not split_ranks:
        raise ValueError("split_ranks cannot be None or empty")
    if parent_pg is not None and engine_of(parent_pg) is not _get_default_group():
        raise ValueError("ringtorch's split_group splits the default group only; pass "
                         "parent_pg=None")
    current, _ = new_subgroups_by_enumeration(split_ranks, timeout=timeout, backend=backend,
                                              pg_options=pg_options, group_desc=group_desc)
    return current


__all__ = ["new_subgroups", "new_subgroups_by_enumeration", "split_group"]

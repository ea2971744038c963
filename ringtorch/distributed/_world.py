"""The one process-global object of ringtorch.distributed: the default group and the group table.

Everything ``init_process_group`` and ``new_group`` create is recorded here and nowhere else,
so that ``destroy_process_group()`` can reset all of it and a later ``init_process_group``
in the same process starts from a clean slate (same group names, same store keys), as torch
allows after a failure. ``group.WORLD`` and ``GroupMember.WORLD`` read the default group
from here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, NewType

from ringtorch.collectives.process_group import ProcessGroup

GroupName = NewType("GroupName", str)
"""A process group's name ("0", "1", ...), as torch types it."""

RankType = int
"""What torch accepts as a rank (``int``; torch also takes a ``SymInt`` when compiling)."""

NON_GROUP_MEMBER = -100
"""What ``new_group`` returns on ranks outside the group (torch's value)."""


@dataclass
class _World:
    """All process-global state of ringtorch.distributed. Nothing else is global."""

    default_pg: ProcessGroup | None = None
    pg_map: dict[ProcessGroup, tuple[str, Any]] = field(default_factory=dict)
    pg_names: dict[ProcessGroup, str] = field(default_factory=dict)
    pg_group_ranks: dict[ProcessGroup, dict[int, int]] = field(default_factory=dict)
    pg_backend_config: dict[ProcessGroup, str] = field(default_factory=dict)
    # each group's object in torch's c10d world (a RingtorchGroup over it; _torch_world.py)
    torch_groups: dict[ProcessGroup, Any] = field(default_factory=dict)
    group_count: int = 0
    init_method: str | None = None
    saved_excepthook: Any = None
    # grow.py: how many knocks of replacement workers this job has answered (every member
    # agrees on it), and on a replacement, the world it joined (a GrownWorld)
    joiners_answered: int = 0
    joined: Any = None

    def register(self, pg: ProcessGroup, backend: str, store: Any, global_ranks: list[int],
                 backend_config: str) -> None:
        """Record a new group this process is a member of."""
        self.pg_map[pg] = (backend, store)
        self.pg_names[pg] = pg.group_name
        self.pg_group_ranks[pg] = {g: r for r, g in enumerate(global_ranks)}
        self.pg_backend_config[pg] = backend_config

    def forget(self, pg: ProcessGroup) -> None:
        """Remove one group (not the default one) from the table."""
        for table in (self.pg_map, self.pg_names, self.pg_group_ranks, self.pg_backend_config,
                      self.torch_groups):
            table.pop(pg, None)

    def reset(self) -> None:
        """Forget every group and restart the name counter (destroy_process_group())."""
        self.default_pg = None
        self.pg_map.clear()
        self.pg_names.clear()
        self.pg_group_ranks.clear()
        self.pg_backend_config.clear()
        self.torch_groups.clear()
        self.group_count = 0
        self.init_method = None
        self.joiners_answered = 0
        self.joined = None
        if self.saved_excepthook is not None:
            sys.excepthook = self.saved_excepthook
            self.saved_excepthook = None

    def next_group_name(self) -> str:
        """The next name from the counter every rank advances in the same order."""
        name = str(self.group_count)
        self.group_count += 1
        return name


_world = _World()


class _WorldMeta(type):
    """Gives ``group`` and ``GroupMember`` the class property ``WORLD`` (the default group)."""

    @property
    def WORLD(cls) -> ProcessGroup | None:
        return _world.default_pg

    @WORLD.setter
    def WORLD(cls, pg: ProcessGroup | None) -> None:
        _world.default_pg = pg


class group(metaclass=_WorldMeta):
    """``group.WORLD`` is the default process group (None before init_process_group)."""


class GroupMember(metaclass=_WorldMeta):
    """``GroupMember.WORLD`` is the default group; ``NON_GROUP_MEMBER`` what non-members get."""

    NON_GROUP_MEMBER = NON_GROUP_MEMBER


def is_non_member(pg: Any) -> bool:
    """Whether ``pg`` is what ``new_group`` gave a rank outside the group."""
    return isinstance(pg, int) and not isinstance(pg, bool) and pg == NON_GROUP_MEMBER


__all__ = ["NON_GROUP_MEMBER", "GroupMember", "GroupName", "RankType", "group", "is_non_member"]

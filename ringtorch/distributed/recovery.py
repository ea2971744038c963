"""shrink_on_failure: after a rank dies, the survivors carry on as a smaller world.

One call in a training loop's ``except`` clause: the survivors agree on who is gone (no need to
know it beforehand: every survivor calls it, and members that do not are left out once known
dead or silent, see ``collectives/shrink_agree.py``), shrink the default group, then rebuild
every other group this rank belonged to from its surviving members, numbered in the new world,
and return the new world. The program's models and optimizers stay in memory; DDP and ZeRO re-wrap on the
new group (``DistributedDataParallel.rewrap``, ``ZeroRedundancyOptimizer.rewrap``) and samplers
are made for the new world size (docs/recovery.md).

The rule kept: every survivor rebuilds the groups in the same order (by their old names), and
only their members take part in each, so no survivor waits for a group it is not in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ringtorch._errors import DistError
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.distributed import _torch_world, groups
from ringtorch.distributed._backend import BackendConfig
from ringtorch.distributed._torch_world import engine_of
from ringtorch.distributed._world import NON_GROUP_MEMBER, _world
from ringtorch.distributed.shrink import SHRINK_ABORT, shrink


@dataclass(frozen=True)
class _GroupPlan:
    """An old group to rebuild: its members as old global ranks, and how it was made."""

    old: ProcessGroup
    name: str
    members: list[int]
    backend_name: str
    backend_config: str
    timeout: timedelta
    desc: str


@dataclass(frozen=True)
class ShrunkWorld:
    """The world after shrink_on_failure.

    Attributes:
        rank: this process's rank in the new default group (``get_rank()`` now).
        world_size: the number of survivors (``get_world_size()`` now).
        previous_rank: this process's rank before the shrink.
        previous_world_size: the world size before the shrink.
        lost_ranks: the ranks (of the previous world) that are gone.
        groups: each group this rank belonged to (the old default group included), mapped to
            the group of its surviving members that replaces it.
    """

    rank: int
    world_size: int
    previous_rank: int
    previous_world_size: int
    lost_ranks: tuple[int, ...]
    groups: dict[ProcessGroup, ProcessGroup] = field(default_factory=dict)

    def replacement(self, old: Any) -> Any:
        """The group that replaces ``old`` (the default group for None or the old default
        group; ``NON_GROUP_MEMBER`` where this rank is not in ``old``).

        Raises:
            ValueError: ``old`` was not a group of this process before the shrink.
        """
        if old is None or old is NON_GROUP_MEMBER:
            return None if old is None else NON_GROUP_MEMBER
        old = engine_of(old)  # torch's object for a group stands for it
        if old in self.groups:
            return self.groups[old]
        raise ValueError(f"{old} was not a group of this process before the shrink")


def shrink_on_failure(error: BaseException | None = None,
                      shrink_flags: int = SHRINK_ABORT) -> ShrunkWorld:
    """Replace the default group and every group made from it with groups of the survivors.

    Call it on every surviving rank when a collective raised (typically ``PeerLostError``,
    which names the dead rank; a timeout's ``DistBackendError`` for a frozen one); pass that
    error as ``error``: anything that is not a ``DistError`` is raised again, since it is not
    a failure of the job's ranks.

    Returns:
        The new world (see ShrunkWorld).

    Raises:
        ShrinkRefusedError: the survivors agreed without this rank (it was taken for dead).
        DistStoreError: the store cannot be reached (its host died).
    """
    if error is not None and not isinstance(error, DistError):
        raise error
    default = groups._get_default_group()
    previous_rank, previous_size = default.rank(), default.size()
    plans = _plans(default)
    cause = str(error).splitlines()[0] if error is not None and str(error) else None
    shrunk = shrink(default, set(), shrink_flags, cause=cause)
    survivors = [r for r in range(previous_size) if r not in shrunk.excluded]
    new_default = shrunk.group
    base = _world.pg_map[new_default][1]
    rebuilt: dict[ProcessGroup, Any] = {default: new_default}
    me = survivors.index(previous_rank)
    for plan in plans:
        members = [survivors.index(g) for g in plan.members if g in survivors]
        if me not in members:
            rebuilt[plan.old] = NON_GROUP_MEMBER
            continue
        impl = BackendConfig(plan.backend_name).cpu_backend()
        rebuilt[plan.old] = groups._make_group(
            len(members), members.index(me), members, impl, plan.backend_name, base,
            f"{plan.name}~{new_default.group_name}", plan.timeout, plan.desc, None,
            plan.backend_config)
        _torch_world.publish(rebuilt[plan.old], impl, members)  # torch's world too
    return ShrunkWorld(new_default.rank(), new_default.size(), previous_rank, previous_size,
                       shrunk.excluded, rebuilt)


def _plans(default: ProcessGroup) -> list[_GroupPlan]:
    """This rank's groups other than the default one, in the order every rank rebuilds them."""
    plans = []
    for pg, (backend_name, _store) in _world.pg_map.items():
        if pg is default:
            continue
        plans.append(_GroupPlan(pg, pg.group_name, groups.get_process_group_ranks(pg),
                                backend_name, _world.pg_backend_config[pg], pg.timeout,
                                pg.group_desc))
    return sorted(plans, key=lambda p: (len(p.name), p.name))


__all__ = ["ShrunkWorld", "shrink_on_failure"]

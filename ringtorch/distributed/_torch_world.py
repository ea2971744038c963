"""One world: the groups ringtorch.distributed makes are groups of torch's c10d world too.

torch's libraries under ringtorch's paths (DeviceMesh, DTensor, FSDP2, DCP, pipelining,
functional collectives: torch's code) find their groups in torch's world: its default group,
its group table (``pg_map``, ``pg_names``, ``pg_group_ranks``, ``pg_backend_config``, tags)
and the registry of group names functional collectives resolve. The rule this module keeps:
every group the facade makes on the engine is entered there as well, as the same engine
group wrapped in a ``RingtorchGroup`` (the backend door's torch ProcessGroup): no second
rendezvous, no transport or store key more. It writes torch's world through torch's own
helpers only (``_update_default_pg``, ``_register_pg_in_world``, ``destroy_process_group``).

torch's ``new_group`` hands subgroup creation to a default group that has a ``new_group``
method; the facade's default group in torch's world (``WorldGroup``) has one, so a subgroup
torch's code makes (a DeviceMesh dimension) is made by the facade under torch's name for it,
and is a group of both worlds. The facade's and torch's group-name counters move together.
The facade hands out torch's object for a group it entered (``torch_object``) and takes
torch's objects wherever it takes a group (``engine_of``), so one object serves both doors.

Nothing is published when torch's world has a default group already (a program that
initialized torch itself) or when the facade's group does not run on the engine (MPI).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.distributed._world import _world

# the facade's backend names that run the engine's native backend (the registry's names)
_ENGINE_NAMES = ("gloo", "native", "ringtorch")
NAME = "ringtorch"  # torch's name of the backend (ringtorch.c10d.group.NAME, not imported)
_CONFIG = f"cpu:{NAME}"
# the backend door's module: imported on the first publication, not with the facade (a
# RingtorchGroup exists only once it is)
_DOOR_MODULE = "ringtorch.c10d.group"


def _c10d() -> Any:
    import torch.distributed.distributed_c10d as c10d

    return c10d


def is_published() -> bool:
    """Whether torch's default group is the facade's (groups are being published)."""
    default = _world.default_pg
    if default is None or default not in _world.torch_groups:
        return False
    return _c10d()._world.default_pg is _world.torch_groups[default]


def publish_default(pg: ProcessGroup, impl_name: str, store: Any,
                    make_subgroup: Callable[..., Any]) -> None:
    """Make the facade's new default group ``pg`` torch's default group too (a no-op when
    torch has one already or ``pg`` does not run on the engine); torch's subgroups of it are
    made by ``make_subgroup`` (see WorldGroup)."""
    c10d = _c10d()
    if impl_name not in _ENGINE_NAMES or c10d.is_initialized():
        return
    from ringtorch.c10d import autoload
    from ringtorch.c10d.group import WorldGroup
    from ringtorch.c10d.store_for_torch import StoreForTorch

    autoload.register()  # torch's new_group names the default's backend: let torch know it
    wrapper = WorldGroup(pg, make_subgroup)
    _world.torch_groups[pg] = wrapper
    c10d._update_default_pg(wrapper)
    c10d._register_pg_in_world(wrapper, backend_name=NAME, store=StoreForTorch(store),
                               group_name=pg.group_name, backend_config=_CONFIG,
                               rank_mapping={r: r for r in range(pg.size())},
                               add_to_default_tag=True)
    follow_count()


def republish_default(pg: ProcessGroup, impl_name: str, store: Any,
                      make_subgroup: Callable[..., Any], was_published: bool) -> None:
    """The facade replaced its default group with ``pg`` (a shrink, a grow back): when the
    old one was torch's default group (``was_published``, asked before the facade retired
    it), torch's world is emptied (every group of it: their ranks no longer mean the same,
    torch's rule when the default group shrinks; the facade has aborted its own already) and
    ``pg`` becomes torch's default group."""
    if not was_published:
        return
    c10d = _c10d()
    if c10d.is_initialized():
        c10d.destroy_process_group()  # the old groups' shutdown: their engines are aborted
    publish_default(pg, impl_name, store, make_subgroup)


def publish(pg: ProcessGroup, impl_name: str, global_ranks: list[int]) -> None:
    """Enter the facade's new subgroup ``pg`` in torch's world (when the default is there)."""
    if impl_name not in _ENGINE_NAMES or not is_published():
        return
    from ringtorch.c10d.group import FacadeGroup
    from ringtorch.c10d.store_for_torch import StoreForTorch

    wrapper = FacadeGroup(pg)
    _world.torch_groups[pg] = wrapper
    _c10d()._register_pg_in_world(wrapper, backend_name=NAME,
                                  store=StoreForTorch(pg.get_group_store()),
                                  group_name=pg.group_name, backend_config=_CONFIG,
                                  rank_mapping={g: r for r, g in enumerate(global_ranks)},
                                  add_to_default_tag=True)


def subgroup_made_for_torch(pg: ProcessGroup | None) -> Any:
    """torch's object for the subgroup ``pg`` the facade made at torch's request (None on a
    rank outside it); torch enters it in its world itself."""
    if pg is None:
        return None
    from ringtorch.c10d.group import FacadeGroup

    wrapper = FacadeGroup(pg)
    _world.torch_groups[pg] = wrapper
    return wrapper


def torch_object(pg: Any) -> Any:
    """What the facade hands out for its group ``pg``: torch's object for it when it is in
    torch's world (so that torch's functions and libraries take it too), else ``pg``."""
    return _world.torch_groups.get(pg, pg)


def follow_torch_count() -> None:
    """The facade's group-name counter catches up with torch's (torch named a group)."""
    _world.group_count = max(_world.group_count, _c10d()._world.group_count)


def follow_count() -> None:
    """torch's group-name counter = the facade's, so that the next name either door gives
    is the same one (every rank advances both in the same order)."""
    if is_published():
        _c10d()._world.group_count = _world.group_count


def engine_of(group: Any) -> Any:
    """The engine's group behind torch's object ``group`` (a RingtorchGroup, made through
    either door); any other object as it is."""
    door = sys.modules.get(_DOOR_MODULE)
    return group.engine if door is not None and isinstance(group, door.RingtorchGroup) else group


def torch_default_engine() -> ProcessGroup | None:
    """The engine's group under torch's default group when the program initialized through
    the backend door (``torch.distributed.init_process_group("ringtorch")``), else None."""
    door = sys.modules.get(_DOOR_MODULE)
    pg = _c10d()._world.default_pg
    return pg.engine if door is not None and isinstance(pg, door.RingtorchGroup) else None


def door_ranks(group: Any) -> dict[int, int] | None:
    """global rank -> group rank of an engine group torch made through the backend door
    (the facade's table does not hold it), else None."""
    if isinstance(group, ProcessGroup) and group.name() == NAME:
        return {g: r for r, g in enumerate(group.global_ranks)}
    return None


def withdraw(pg: ProcessGroup) -> None:
    """The facade destroyed its subgroup ``pg``: torch's world forgets it too."""
    wrapper = _world.torch_groups.pop(pg, None)
    if wrapper is not None and wrapper in _c10d()._world.pg_map:
        _c10d().destroy_process_group(wrapper)


def withdraw_all() -> None:
    """The facade destroyed its world: so does torch (every group of its world, the ones
    torch's code made there included), when its default group is the facade's."""
    published = is_published()
    _world.torch_groups.clear()
    if published:
        _c10d().destroy_process_group()


__all__ = ["door_ranks", "engine_of", "follow_count", "follow_torch_count", "is_published",
           "publish", "publish_default", "republish_default", "subgroup_made_for_torch",
           "torch_default_engine", "torch_object", "withdraw", "withdraw_all"]

"""shrink_group for groups of backend "ringtorch" made through torch.distributed.

torch's own ``torch.distributed.shrink_group`` asks the group's backend object to ``shrink``
and wraps what it returns in a new C++ ProcessGroup through ``_register_backend``, which
accepts only a C++ ``c10d::Backend``; torch offers no Python subclass of that class (it has
no constructor from Python), so no backend written in Python can pass through it
(``RingtorchGroup.shrink`` says so and names this function). This is the same call for door
groups: torch's signature and flags, torch's own validation functions (so its messages), and
torch's own helpers for the group table (other groups destroyed when the default group
shrinks, the old group destroyed, the new one registered under torch's hashed name and made
the default), around the engine's agreement (``collectives/shrink_agree.py``) and a new
engine group on fresh transports. The rule kept: only survivors' groups reach torch's table,
and only once the agreement named them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ringtorch import _config
from ringtorch._errors import DistError
from ringtorch._observe.hang_ask import HANG
from ringtorch.c10d import observe
from ringtorch.c10d.group import RingtorchGroup, make_engine
from ringtorch.collectives import liveness
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.collectives.shrink_agree import ShrinkRefusedError, agree, store_lost
from ringtorch.store import PrefixStore

SHRINK_DEFAULT = 0x00
"""shrink_group's default: the old group is aborted once the survivors have agreed."""
SHRINK_ABORT = 0x01
"""shrink_group aborts the old group first, failing its operations still in flight."""


def shrink_group(ranks_to_exclude: list[int], group: Any = None,
                 shrink_flags: int = SHRINK_DEFAULT, pg_options: Any = None) -> Any:
    """torch.distributed.shrink_group for a group of backend "ringtorch" (any other group is
    handed to torch's function). Only the survivors call it; see torch's documentation for
    the arguments. Returns the new group; when ``group`` is the default group (or None), it
    becomes torch's default group and every other group is destroyed.

    Raises:
        NotImplementedError: this torch has no shrink_group.
        TypeError, ValueError, RuntimeError: torch's checks of the arguments, in its words.
        ShrinkRefusedError: the survivors agreed without this rank; it may not rejoin.
        DistStoreError: the store cannot be reached (its host died).
    """
    c10d = dist.distributed_c10d
    if not hasattr(dist, "shrink_group"):
        raise NotImplementedError(f"torch {torch.__version__} has no shrink_group: shrinking "
                                  f"a group needs a torch that offers it")
    c10d._validate_shrink_inputs(ranks_to_exclude, shrink_flags)
    info = c10d._prepare_shrink_target_group(group)
    target = info["process_group"]
    if not isinstance(target, RingtorchGroup):
        return dist.shrink_group(ranks_to_exclude, group, shrink_flags, pg_options)
    if target.base_store is None:  # made by ringtorch.distributed: its shrink keeps both worlds
        raise TypeError(f"process group '{info['group_name']}' was made by "
                        f"ringtorch.distributed: shrink it with "
                        f"ringtorch.distributed.shrink_group")
    excluded = c10d._validate_and_process_excluded_ranks(ranks_to_exclude, info)
    original_ranks = list(c10d.get_process_group_ranks(target))
    engine, survivors = _shrink_engine(target, excluded, shrink_flags, pg_options)
    return _register(info, engine, [original_ranks[r] for r in survivors])


def _shrink_engine(target: RingtorchGroup, excluded: set[int], shrink_flags: int,
                   pg_options: Any) -> tuple[ProcessGroup, tuple[int, ...]]:
    """The survivors' agreement and their new engine group (and the surviving group ranks)."""
    old = target.engine
    store, base = old.get_group_store(), target.base_store
    me, size, name = old.rank(), old.size(), old.group_name
    if shrink_flags & SHRINK_ABORT:
        old.abort(f"process group '{name}' is being shrunk (SHRINK_ABORT)")
    wait_s = _config.SHRINK_WAIT_S.get()
    retired: list[bool] = []

    def build(survivors: list[int], attempt: int) -> ProcessGroup:
        if not retired:  # the old group goes once the first census has settled
            retired.append(True)
            old.abort(f"process group '{name}' was shrunk: its survivors (ranks {survivors}) "
                      f"go on without ranks {[r for r in range(size) if r not in survivors]}")
        new_name = f"{name}~{round_no}.{attempt}"
        return make_engine(base, f"ringtorch/shrunk/{new_name}", survivors.index(me),
                           len(survivors), old.timeout, new_name, [old.global_ranks[r] for r in survivors],
                           pg_options, timedelta(seconds=wait_s))

    def drop(engine: ProcessGroup) -> None:
        engine.abort()
        observe.group_gone(engine)

    try:
        # each call on this group gets its own key space; survivors call equally often
        round_no = store.add(f"rt_shrink/round/{me}", 1)
        agreement = agree(PrefixStore(f"rt_shrink/{round_no}/", store), me, size, excluded,
                          lambda r: liveness.probe(store, r), wait_s, name, build, drop)
    except (OSError, DistError) as exc:
        lost = None if isinstance(exc, ShrinkRefusedError) else store_lost(store, name, exc)
        if lost is None:
            raise
        raise lost from exc
    return agreement.built, agreement.survivors


def _register(info: dict[str, Any], engine: ProcessGroup, remaining: list[int]) -> Any:
    """torch's group table after a shrink, as torch's ``_finalize_shrunk_group`` leaves it."""
    c10d = dist.distributed_c10d
    target, is_default = info["process_group"], info["is_default_group"]
    if is_default:
        c10d._destroy_all_other_groups(exclude_group=target)
    backend_name, store = c10d._world.pg_map[target]
    backend_config = c10d._world.pg_backend_config.get(target, "")
    # torch names the shrunk group by a hash of the original group's ranks
    new_name = c10d._process_group_name(list(c10d.get_process_group_ranks(target)),
                                        use_hashed_name=True)
    c10d._cleanup_original_group(target, is_default)
    new_pg = RingtorchGroup(engine, target.base_store)
    new_pg._set_group_name(new_name)
    new_pg._set_group_desc("default:shrunken" if is_default else f"{info['group_name']}:shrunk")
    if is_default:
        c10d._update_default_pg(new_pg)
        HANG.renumber(new_pg.rank(), remaining)  # hang reports ask the survivors only
    c10d._register_pg_in_world(
        pg=new_pg, backend_name=backend_name, store=store, group_name=new_name,
        backend_config=backend_config,
        rank_mapping={g: i for i, g in enumerate(remaining)})
    return new_pg


__all__ = ["SHRINK_ABORT", "SHRINK_DEFAULT", "shrink_group"]

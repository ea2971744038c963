"""shrink_group: replace a group that lost ranks with a new group of its survivors.

torch's signature, flags, checks and messages (torch implements it for NCCL only); on ringtorch's
native backend. The survivors agree through the store on who is gone
(``collectives/shrink_agree.py``: a rank that died, even during the shrink, is left out; a rank
that was only slow is left out and refused if it comes back), then build the new group from
nothing: a new name, hence a new store prefix, new sockets and new shared-memory segments;
nothing of the old group's transports is reused.
The old group is aborted (its peers, the slow rank included, fail their pending and
later operations with the reason) and forgotten. Ranks are renumbered as torch does: a
survivor's new rank is its position among the survivors, in the old group's order. Shrinking
the default group destroys every other group (their ranks no longer mean the same thing) and
makes the new group the default one, in torch's world too when the old one was there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ringtorch import _config
from ringtorch._errors import DistError
from ringtorch._observe.hang_ask import HANG
from ringtorch.collectives import liveness
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.collectives.shrink_agree import ShrinkRefusedError, agree, store_lost
from ringtorch.distributed import _torch_world, groups
from ringtorch.distributed._backend import BackendConfig
from ringtorch.distributed._torch_world import engine_of
from ringtorch.distributed._world import _world
from ringtorch.store import PrefixStore

log = logging.getLogger(__name__)

SHRINK_DEFAULT = 0x00
"""shrink_group's default: the old group is aborted once the survivors have agreed."""
SHRINK_ABORT = 0x01
"""shrink_group aborts the old group first, failing its operations still in flight."""


@dataclass(frozen=True)
class Shrunk:
    """What one shrink did: the new group, and the old group's ranks it left out."""

    group: ProcessGroup
    excluded: tuple[int, ...]


def shrink_group(ranks_to_exclude: list[int], group: ProcessGroup | None = None,
                 shrink_flags: int = SHRINK_DEFAULT, pg_options: Any | None = None
                 ) -> ProcessGroup:
    """Make a new group of ``group``'s ranks other than ``ranks_to_exclude`` (group ranks).

    Only the survivors call it. They agree through the store on who is gone: the ranks any
    survivor excludes, and any member that neither calls it nor is alive (or, on another
    host, does not call it within ``RINGTORCH_SHRINK_WAIT_S``). Returns the new group; when
    ``group`` is the default group (or None), the new group becomes the default group and
    every other group is destroyed.

    Raises:
        TypeError: ``ranks_to_exclude`` is not a list of ints, or the group's backend cannot
            shrink.
        ValueError: ``ranks_to_exclude`` is empty, out of range, repeats a rank or excludes
            every rank; ``shrink_flags`` is not SHRINK_DEFAULT or SHRINK_ABORT; the group has
            fewer than 2 ranks.
        RuntimeError: this rank is in ``ranks_to_exclude``.
        ShrinkRefusedError: the survivors agreed without this rank (it was excluded or taken
            for dead); it may not rejoin.
        DistStoreError: the store cannot be reached (its host died).
    """
    _check_inputs(ranks_to_exclude, shrink_flags)
    target = engine_of(group) if group is not None else groups._get_default_group()
    size = target.size()
    if size <= 1:
        raise ValueError(f"Cannot shrink a process group with size {size}. Group must have at "
                         f"least 2 ranks to support shrinking.")
    backend = target._get_backend()
    if not getattr(backend, "supports_shrinking", False):
        raise TypeError(f"Process group backend for '{target.group_name}' does not support "
                        f"shrinking operations.")
    excluded = _check_excluded(ranks_to_exclude, size, target.rank())
    return shrink(target, excluded, shrink_flags, pg_options).group


def shrink(target: ProcessGroup, excluded: set[int], shrink_flags: int = SHRINK_DEFAULT,
           pg_options: Any | None = None, cause: str | None = None) -> Shrunk:
    """shrink_group without its argument checks (the recovery helper calls it with an empty
    ``excluded``: the agreement finds who is gone). ``cause``: the failure that made this
    rank shrink, told to the peers whose operations an abort-first shrink fails, so that a
    survivor slower to notice reads what happened rather than only who aborted."""
    old_name = target.group_name
    backend_name, old_store = _world.pg_map[target]
    backend_config = _world.pg_backend_config[target]
    old_globals = groups.get_process_group_ranks(target)
    is_default = target is _world.default_pg
    published = _torch_world.is_published()  # torch's world holds the facade's groups
    impl_name = BackendConfig(backend_name).cpu_backend()
    if shrink_flags & SHRINK_ABORT:
        target.abort(f"it shrinks the group after: {cause}" if cause else None)
    wait_s = _config.SHRINK_WAIT_S.get()
    retired: list[bool] = []

    def build(survivors: list[int], attempt: int) -> ProcessGroup:
        if not retired:  # the old group goes once the first census has settled
            retired.append(True)
            _retire(target, is_default, f"process group '{old_name}' was shrunk: its survivors "
                    f"(ranks {survivors}) go on without ranks "
                    f"{[r for r in range(target.size()) if r not in survivors]}")
        return groups._make_group(
            len(survivors), survivors.index(target.rank()),
            [old_globals[r] for r in survivors], impl_name, backend_name,
            old_store.underlying_store, f"{old_name}~{round_no}.{attempt}",
            target.timeout, "default:shrunken" if is_default else f"{old_name}:shrunk",
            pg_options, backend_config, setup_timeout=timedelta(seconds=wait_s))

    def drop(pg: ProcessGroup) -> None:
        pg.abort()
        _world.forget(pg)

    try:
        # each call on this group gets its own key space; survivors call equally often
        round_no = old_store.add(f"rt_shrink/round/{target.rank()}", 1)
        agreement = agree(PrefixStore(f"rt_shrink/{round_no}/", old_store), target.rank(),
                          target.size(), excluded, lambda r: liveness.probe(old_store, r),
                          wait_s, old_name, build, drop)
    except (OSError, DistError) as exc:
        lost = None if isinstance(exc, ShrinkRefusedError) else store_lost(old_store, old_name,
                                                                           exc)
        if lost is None:
            raise
        raise lost from exc
    built = agreement.built
    if is_default:
        _world.default_pg = built
        # hang reports ask the survivors only, and name them by both numbers
        HANG.renumber(built.rank(), list(built.global_ranks))
        _torch_world.republish_default(built, impl_name, old_store.underlying_store,
                                       groups._torch_subgroup, published)
    else:
        _torch_world.publish(built, impl_name, list(built.global_ranks))
    return Shrunk(agreement.built, tuple(r for r in range(target.size())
                                         if r not in agreement.survivors))


def _retire(target: ProcessGroup, is_default: bool, reason: str) -> None:
    """Abort the old group (and, for the default group, every other group) and forget it."""
    others = [pg for pg in list(_world.pg_map) if pg is not target] if is_default else []
    if others:
        log.warning("Shrinking default group will destroy %d other process groups: %s. This "
                    "is necessary because shrinking the default group reassigns global ranks, "
                    "making existing groups inconsistent.", len(others),
                    ", ".join(_world.pg_names[pg] for pg in others))
    for pg in [*others, target]:
        pg.abort(reason)
        if not is_default:  # torch's world forgets it too (a shrunk default empties it)
            _torch_world.withdraw(pg)
        _world.forget(pg)
    if is_default:
        _world.default_pg = None


def _check_inputs(ranks_to_exclude: Any, shrink_flags: Any) -> None:
    if not isinstance(ranks_to_exclude, list):
        raise TypeError(f"ranks_to_exclude must be a list, but got "
                        f"{type(ranks_to_exclude).__name__}. Example: [1, 3, 5] to exclude "
                        f"ranks 1, 3, and 5.")
    if not ranks_to_exclude:
        raise ValueError("ranks_to_exclude cannot be empty. To shrink a group, you must specify "
                         "at least one rank to exclude. Example: [failed_rank_id]")
    if not isinstance(shrink_flags, int) or shrink_flags not in (SHRINK_DEFAULT, SHRINK_ABORT):
        raise ValueError(f"Invalid shrink_flags value: {shrink_flags}. Must be one of: "
                         f"SHRINK_DEFAULT ({SHRINK_DEFAULT}) or SHRINK_ABORT ({SHRINK_ABORT}). "
                         f"Use SHRINK_ABORT to abort ongoing operations before shrinking.")


def _check_excluded(ranks_to_exclude: list[Any], size: int, me: int) -> set[int]:
    excluded: set[int] = set()
    for i, rank in enumerate(ranks_to_exclude):
        if not isinstance(rank, int):
            raise TypeError(f"All elements in ranks_to_exclude must be integers. Element at "
                            f"index {i} is {type(rank).__name__}: {rank}")
        if not 0 <= rank < size:
            raise ValueError(f"Rank {rank} at index {i} is out of bounds for group size {size}. "
                             f"Valid ranks are in range [0, {size - 1}].")
        if rank in excluded:
            raise ValueError(f"Duplicate rank {rank} found in ranks_to_exclude at index {i}. "
                             f"Each rank can only be excluded once.")
        excluded.add(rank)
    if len(excluded) >= size:
        raise ValueError(f"Cannot exclude all {size} ranks from process group. At least one "
                         f"rank must remain. Excluding {len(excluded)} ranks.")
    if me in excluded:
        raise RuntimeError(f"Current rank {me} is in the exclusion list and should not call "
                           f"shrink_group(). Only non-excluded ranks should participate in the "
                           f"shrinking operation. Excluded ranks should terminate their "
                           f"processes instead.")
    return excluded


__all__ = ["SHRINK_ABORT", "SHRINK_DEFAULT", "Shrunk", "shrink", "shrink_group"]

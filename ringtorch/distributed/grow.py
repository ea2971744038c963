"""Grow back: the job's ranks admit replacement workers at a step boundary, without stopping.

A replacement is a process started with ``RINGTORCH_JOIN=1`` (ringrun starts one when it
restarts a failed worker alone: docs/recovery.md). Its ``init_process_group`` does not meet a
new job: it knocks in the running job's store and waits to be admitted (``join_running_job``).
The job's ranks call ``admit_joiners()`` once per step. When nobody knocked, that costs rank 0
one store request and every rank one 8-byte broadcast from rank 0, which is also how they all
decide at the same call. When someone knocked, the members and the joiners make a new default
group from nothing (a new name, hence new store keys, sockets and shared memory), check that
every one of them made it, and only then retire the old group; a failed build leaves the
members on their old group and refuses the joiners.

Ranks: a process keeps the rank its launcher gave it (its slot: a shrink keeps the survivors'
slots as the new group's global ranks), and the grown group orders its members by slot. A
replacement takes its old slot back, so after a shrink and a grow back every rank is again its
``RANK``, ``LOCAL_RANK`` still names its device, and the launcher's view of the ranks holds.

Keys, under "rt_grow/" in the default group's base store (the "default_pg" prefix of its
generation, see groups._default_prefix):

    knocks             append-only, one JSON line per joiner: {"slot": RANK, "id": unique}
    arrivals           add: how many joiners knocked (rank 0's one request per step)
    answer/<id>        compare_set by rank 0: {"upto": n} (admitted by plan n) or
                       {"refused": why}; or by the joiner, {"withdrawn": true}, when it gave up
    plan/<n>           the grown group: name, slots, backend, timeout, the group-name counter
    <n>/built/<rank>   each participant: "ok" or "failed"; <n>/verdict: [missing, failed]

The rule kept: a joiner is in the world only if rank 0's answer admitted it and the verdict of
its plan says every participant made the group; every participant reads the same two keys.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import torch

from ringtorch._observe.hang_ask import HANG
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.distributed import _torch_world, groups, object_ops, ops
from ringtorch.distributed._backend import BackendConfig
from ringtorch.distributed._grow_join import (
    PREFIX,
    GrownWorld,
    JoinError,
    build,
    grown_world,
)
from ringtorch.distributed._world import _world
from ringtorch.store import PrefixStore

log = logging.getLogger(__name__)


def admit_joiners() -> GrownWorld | None:
    """Admit the replacement workers waiting to join, if any; every rank of the default group
    calls it at the same point of each step (a step boundary).

    Returns:
        None when nobody waits (or every waiting worker was refused: a second worker for one
        rank, or one for a rank that is alive); else the grown world: the joiners are in the
        default group now, every other group is destroyed (make them again, joiners included),
        and DDP must be re-wrapped (``DistributedDataParallel.rewrap``) and the optimizer state
        sent to the joiners (``broadcast_optimizer_state``), which do the same on their side.
        A grown group that could not be made (a participant died on the way) is dropped: the
        members stay on their group and None is returned.
    """
    default = groups._get_default_group()
    base = _world.pg_map[default][1].underlying_store
    store = PrefixStore(PREFIX, base)
    answered = upto = _world.joiners_answered
    if default.rank() == 0 and int(store.add("arrivals", 0)) > answered:
        upto = _answer_knocks(store, default, answered)
    if default.size() > 1:  # rank 0's decision, so that every rank admits at the same call
        flag = torch.tensor([upto], dtype=torch.int64)
        ops.broadcast(flag, group=default, group_src=0)
        upto = int(flag.item())
    if upto == answered:
        return None
    _world.joiners_answered = upto
    plan = json.loads(store.get(f"plan/{upto}"))
    if not plan["joiners"]:
        return None
    slot = groups.get_process_group_ranks(default)[default.rank()]
    grown = build(plan, base, store, slot, upto, groups._make_group)
    if grown is None:
        log.warning("replacement worker(s) for rank(s) %s could not join: the grown group was "
                    "not made by every participant; going on at world size %d",
                    plan["joiners"], default.size())
        return None
    _retire(default, grown, plan, base)
    return grown_world(grown, plan, is_joiner=False)


def joined_running_job() -> GrownWorld | None:
    """On a replacement worker, the world its ``init_process_group`` joined; else None."""
    return _world.joined


def broadcast_module_state(module: torch.nn.Module, group_src: int = 0,
                           group: Any = None) -> None:
    """Give every rank of ``group`` (default: the default group) rank ``group_src``'s
    parameters and buffers of ``module``, in place. After ``admit_joiners`` send them from
    ``GrownWorld.state_source`` *before* DDP is made or re-wrapped on the grown group: DDP
    broadcasts from rank 0, which is a joiner when rank 0 was replaced. Every rank of the
    group calls it."""
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            ops.broadcast(tensor, group=group, group_src=group_src)


def broadcast_optimizer_state(optimizer: Any, group_src: int = 0, group: Any = None) -> None:
    """Give every rank of ``group`` (default: the default group) the state of rank
    ``group_src``'s ``optimizer`` (a ``torch.optim.Optimizer``; its ``state_dict``, sent as an
    object from that rank). For an optimizer every rank holds whole (plain optimizers under
    DDP) after ``admit_joiners``; a ``ZeroRedundancyOptimizer`` is re-sharded by its
    ``rewrap`` instead. Every rank of the group calls it."""
    me = groups.get_rank(group)
    holder = [optimizer.state_dict() if me == group_src else None]
    object_ops.broadcast_object_list(holder, group=group, group_src=group_src)
    if me != group_src:
        optimizer.load_state_dict(holder[0])


def _answer_knocks(store: Any, default: ProcessGroup, answered: int) -> int:
    """Rank 0: answer every knock after the first ``answered`` and write the plan; the new
    count of knocks answered."""
    # each knock is one append, whole or absent, made before "arrivals" counted it
    knocks = [json.loads(line) for line in store.get("knocks").decode().splitlines()]
    upto = len(knocks)
    members = set(groups.get_process_group_ranks(default))
    taken = set(members)
    admitted: list[int] = []
    for knock in knocks[answered:]:
        slot = knock["slot"]
        why = (f"rank {slot} is a member of the running job already" if slot in members else
               f"another replacement for rank {slot} was admitted first" if slot in taken else
               None)
        answer = json.dumps({"upto": upto} if why is None else {"refused": why})
        # the joiner may have given up (withdrawn) just before: its answer stands then
        if store.compare_set(f"answer/{knock['id']}", "", answer) == answer.encode() and \
                why is None:
            admitted.append(slot)
            taken.add(slot)
    plan = {"name": f"{default.group_name}+{upto}", "slots": sorted(taken),
            "joiners": admitted, "backend": _world.pg_map[default][0],
            "config": _world.pg_backend_config[default],
            "timeout_s": default.timeout.total_seconds(), "group_count": _world.group_count,
            "previous_world_size": default.size()}
    store.set(f"plan/{upto}", json.dumps(plan))
    return upto


def _retire(old: ProcessGroup, grown: ProcessGroup, plan: dict[str, Any], base: Any) -> None:
    """Make ``grown`` the default group (in torch's world too, when the old one was there);
    shut the old one and every other group down."""
    published = _torch_world.is_published()
    others = [pg for pg in list(_world.pg_map) if pg is not old and pg is not grown]
    if others:
        log.warning("Growing the default group destroys %d other process groups: %s; make "
                    "them again on every rank, the joiners included",
                    len(others), ", ".join(_world.pg_names[pg] for pg in others))
    for pg in [*others, old]:
        pg.shutdown()
        _world.forget(pg)
    _world.default_pg = grown
    HANG.renumber(grown.rank(), list(grown.global_ranks))  # hang reports ask the new world
    _torch_world.republish_default(grown, BackendConfig(plan["backend"]).cpu_backend(), base,
                                   groups._torch_subgroup, published)


__all__ = ["GrownWorld", "JoinError", "admit_joiners", "broadcast_module_state",
           "broadcast_optimizer_state",
           "joined_running_job"]

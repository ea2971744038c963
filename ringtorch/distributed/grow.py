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
import os
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from ringtorch import _config
from ringtorch._errors import DistError
from ringtorch.collectives import liveness
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.distributed import groups, object_ops, ops
from ringtorch.distributed._backend import BackendConfig
from ringtorch.distributed._shrink_agree import _verdict
from ringtorch.distributed._world import _world
from ringtorch.store import PrefixStore

log = logging.getLogger(__name__)

_PREFIX = "rt_grow"


class JoinError(DistError):
    """A replacement worker could not join the running job: refused, or nobody admitted it."""


@dataclass(frozen=True)
class GrownWorld:
    """The world after replacement workers joined it.

    Attributes:
        rank: this process's rank in the new default group (``get_rank()`` now).
        world_size: the new world size (``get_world_size()`` now).
        previous_world_size: the members' world size before the joiners came.
        joined_ranks: the joiners' ranks in the new world.
        is_joiner: whether this process is one of the joiners.
    """

    rank: int
    world_size: int
    previous_world_size: int
    joined_ranks: tuple[int, ...]
    is_joiner: bool


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
    store = PrefixStore(_PREFIX, base)
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
    grown = _build(plan, base, store, slot, upto)
    if grown is None:
        log.warning("replacement worker(s) for rank(s) %s could not join: the grown group was "
                    "not made by every participant; going on at world size %d",
                    plan["joiners"], default.size())
        return None
    _retire(default, grown, plan)
    return _grown_world(grown, plan, is_joiner=False)


def join_running_job(raw_store: Any, slot: int, timeout: timedelta) -> tuple[ProcessGroup, Any]:
    """Join the running job on ``raw_store`` (the rendezvous store) as a replacement for rank
    ``slot``; ``init_process_group`` calls it under ``RINGTORCH_JOIN=1``.

    Returns:
        The new default group and its base store (the generation's "default_pg" prefix).

    Raises:
        JoinError: no job ran as rank ``slot`` on this store; no rank admitted this worker
            within ``timeout``; the job refused it; or the grown group could not be made.
    """
    generation = int(raw_store.add(f"rt_init_generation/{slot}", 0))
    if generation == 0:
        raise JoinError(f"rank {slot} cannot join a running job: no process ran as rank {slot} "
                        f"on this store (RINGTORCH_JOIN=1 starts a replacement for a rank of a "
                        f"running job)")
    base = PrefixStore(groups._generation_prefix(generation), raw_store)
    store = PrefixStore(_PREFIX, base)
    ident = f"{slot}-{os.getpid()}-{secrets.token_hex(4)}"
    store.append("knocks", json.dumps({"slot": slot, "id": ident}) + "\n")
    store.add("arrivals", 1)
    answer = _wait_answer(store, f"answer/{ident}", slot, timeout)
    if "refused" in answer:
        raise JoinError(f"rank {slot} was refused by the running job: {answer['refused']}")
    upto = int(answer["upto"])
    plan = json.loads(store.get(f"plan/{upto}"))
    pg = _build(plan, base, store, slot, upto)
    if pg is None:
        raise JoinError(f"rank {slot} was admitted, but the grown group was not made by every "
                        f"participant (one died or did not answer within "
                        f"{_config.SHRINK_WAIT_S.get():g} s); the job goes on without it")
    _world.default_pg = pg
    _world.group_count = int(plan["group_count"])
    _world.joiners_answered = upto
    _world.joined = _grown_world(pg, plan, is_joiner=True)
    return pg, base


def joined_running_job() -> GrownWorld | None:
    """On a replacement worker, the world its ``init_process_group`` joined; else None."""
    return _world.joined


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


def _wait_answer(store: Any, key: str, slot: int, timeout: timedelta) -> dict[str, Any]:
    try:
        store.wait([key], timeout)
    except DistError:  # timed out (a store that is gone fails the compare_set below too)
        pass
    # withdraw, unless rank 0 answered: then its answer stands, even one given just now
    answer = dict(json.loads(store.compare_set(key, "", json.dumps({"withdrawn": True}))))
    if "withdrawn" in answer:
        raise JoinError(f"rank {slot} could not join the running job within {timeout}: no rank "
                        f"of the job admitted it (it waited for its answer, key "
                        f"'{_PREFIX}/{key}' in the job's store; the job's ranks admit "
                        f"replacements when they call dist.admit_joiners(), once per step)")
    return answer


def _build(plan: dict[str, Any], base: Any, store: Any, slot: int,
           upto: int) -> ProcessGroup | None:
    """Make the plan's group as the member of ``slot``; None if some participant could not
    (what it made is then dropped again)."""
    slots, name = list(plan["slots"]), str(plan["name"])
    rank = slots.index(slot)
    wait_s = _config.SHRINK_WAIT_S.get()
    pg: ProcessGroup | None = None
    try:
        pg = groups._make_group(
            len(slots), rank, slots, BackendConfig(plan["backend"]).cpu_backend(),
            plan["backend"], base, name, timedelta(seconds=plan["timeout_s"]), "default:grown",
            None, plan["config"], setup_timeout=timedelta(seconds=wait_s))
    except Exception:  # a participant died or vanished while the group was made
        log.warning("making the grown group '%s' failed", name, exc_info=True)
    store.set(f"{upto}/built/{rank}", "ok" if pg is not None else "failed")
    group_store = PrefixStore(f"{name}/", base)
    missing, failed = _verdict(store, f"{upto}/", list(range(len(slots))),
                               lambda r: liveness.probe(group_store, r), wait_s)
    if not missing and not failed:
        return pg
    if pg is not None:
        pg.abort(f"the grown group '{name}' was not made by every participant")
        _world.forget(pg)
    return None


def _retire(old: ProcessGroup, grown: ProcessGroup, plan: dict[str, Any]) -> None:
    """Make ``grown`` the default group; shut the old one and every other group down."""
    others = [pg for pg in list(_world.pg_map) if pg is not old and pg is not grown]
    if others:
        log.warning("Growing the default group destroys %d other process groups: %s; make "
                    "them again on every rank, the joiners included",
                    len(others), ", ".join(_world.pg_names[pg] for pg in others))
    for pg in [*others, old]:
        pg.shutdown()
        _world.forget(pg)
    _world.default_pg = grown


def _grown_world(pg: ProcessGroup, plan: dict[str, Any], is_joiner: bool) -> GrownWorld:
    slots = list(plan["slots"])
    return GrownWorld(pg.rank(), pg.size(), int(plan["previous_world_size"]),
                      tuple(sorted(slots.index(s) for s in plan["joiners"])), is_joiner)


__all__ = ["GrownWorld", "JoinError", "admit_joiners", "broadcast_optimizer_state",
           "join_running_job", "joined_running_job"]

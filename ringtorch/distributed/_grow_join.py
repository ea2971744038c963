"""The replacement worker's side of growing back, and the group making both sides share.

``init_process_group`` calls ``join_running_job`` under ``RINGTORCH_JOIN=1``; ``grow.py`` is
the members' side and describes the protocol (its keys, the plan, the verdict). This module
does not import ``groups``, which imports it: what it needs of it (making a group) is passed in.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ringtorch import _config
from ringtorch._errors import DistError
from ringtorch.collectives import liveness
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.collectives.shrink_agree import verdict
from ringtorch.distributed._backend import BackendConfig
from ringtorch.distributed._world import _world
from ringtorch.store import PrefixStore

log = logging.getLogger(__name__)

PREFIX = "rt_grow"
CLOSED = "closed"  # set by rank 0 when the job's default group is destroyed
ENDED = ("the running job has ended (its ranks destroyed their default group) before it "
         "admitted this worker")
"""The grow-back keys live under this prefix of the default group's base store."""

MakeGroup = Callable[..., ProcessGroup]
"""groups._make_group."""


def generation_prefix(generation: int) -> str:
    """The default group's store prefix in the ``generation``-th initialization (from 1)."""
    return "default_pg" if generation == 1 else f"default_pg/{generation}"


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
        state_source: the new rank of the first member that is not a joiner: send the
            training state from it (a replacement for rank 0 is rank 0 of the grown world,
            and holds no state yet).
    """

    rank: int
    world_size: int
    previous_world_size: int
    joined_ranks: tuple[int, ...]
    is_joiner: bool
    state_source: int


def join_running_job(raw_store: Any, slot: int, timeout: timedelta,
                     make_group: MakeGroup) -> tuple[ProcessGroup, Any]:
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
    base = PrefixStore(generation_prefix(generation), raw_store)
    store = PrefixStore(PREFIX, base)
    ident = f"{slot}-{os.getpid()}-{secrets.token_hex(4)}"
    store.append("knocks", json.dumps({"slot": slot, "id": ident}) + "\n")
    store.add("arrivals", 1)
    # rank 0 marks the job ended before it reads the knocks (close_to_joiners): either it saw
    # this knock and answers it, or this worker sees the mark now; it never waits in vain
    answer = (_withdraw(store, f"answer/{ident}") if store.check([CLOSED]) else
              _wait_answer(store, f"answer/{ident}", slot, timeout))
    if "withdrawn" in answer:
        raise JoinError(f"rank {slot} cannot join: {ENDED}")
    if "refused" in answer:
        raise JoinError(f"rank {slot} was refused by the running job: {answer['refused']}")
    upto = int(answer["upto"])
    plan = json.loads(store.get(f"plan/{upto}"))
    pg = build(plan, base, store, slot, upto, make_group)
    if pg is None:
        raise JoinError(f"rank {slot} was admitted, but the grown group was not made by every "
                        f"participant (one died or did not answer within "
                        f"{_config.SHRINK_WAIT_S.get():g} s); the job goes on without it")
    _world.default_pg = pg
    _world.group_count = int(plan["group_count"])
    _world.joiners_answered = upto
    _world.joined = grown_world(pg, plan, is_joiner=True)
    return pg, base


def close_to_joiners(default: ProcessGroup) -> None:
    """On rank 0, as the job's default group ``default`` is destroyed: mark the job ended,
    then refuse every replacement that knocked and was not answered, so that none waits its
    whole timeout for ranks that are gone (two store requests when nobody knocked). A store
    that is gone already is left alone: nobody can knock there."""
    backend, base = _world.pg_map[default]
    if default.rank() != 0 or backend == "mpi":
        return
    try:
        store = PrefixStore(PREFIX, base.underlying_store)
        store.set(CLOSED, "1")
        if not int(store.add("arrivals", 0)):
            return
        refusal = json.dumps({"refused": ENDED})
        for line in store.get("knocks").decode().splitlines():
            store.compare_set(f"answer/{json.loads(line)['id']}", "", refusal)
    except Exception:  # at teardown, a store that went first is no error
        log.debug("could not mark the job ended for replacement workers", exc_info=True)


def _withdraw(store: Any, key: str) -> dict[str, Any]:
    """Withdraw this knock, unless rank 0 answered it: then its answer stands, even one given
    just now."""
    return dict(json.loads(store.compare_set(key, "", json.dumps({"withdrawn": True}))))


def _wait_answer(store: Any, key: str, slot: int, timeout: timedelta) -> dict[str, Any]:
    try:
        store.wait([key], timeout)
    except DistError:  # timed out (a store that is gone fails the compare_set below too)
        pass
    answer = _withdraw(store, key)
    if "withdrawn" in answer and store.check([CLOSED]):
        raise JoinError(f"rank {slot} cannot join: {ENDED}")
    if "withdrawn" in answer:
        raise JoinError(f"rank {slot} could not join the running job within {timeout}: no rank "
                        f"of the job admitted it (it waited for its answer, key "
                        f"'{PREFIX}/{key}' in the job's store; the job's ranks admit "
                        f"replacements when they call dist.admit_joiners(), once per step)")
    return answer


def build(plan: dict[str, Any], base: Any, store: Any, slot: int, upto: int,
          make_group: MakeGroup) -> ProcessGroup | None:
    """Make the plan's group as the member of ``slot``; None if some participant could not
    (what it made is then dropped again)."""
    slots, name = list(plan["slots"]), str(plan["name"])
    rank = slots.index(slot)
    wait_s = _config.SHRINK_WAIT_S.get()
    pg: ProcessGroup | None = None
    try:
        pg = make_group(
            len(slots), rank, slots, BackendConfig(plan["backend"]).cpu_backend(),
            plan["backend"], base, name, timedelta(seconds=plan["timeout_s"]), "default:grown",
            None, plan["config"], setup_timeout=timedelta(seconds=wait_s))
    except Exception:  # a participant died or vanished while the group was made
        log.warning("making the grown group '%s' failed", name, exc_info=True)
    store.set(f"{upto}/built/{rank}", "ok" if pg is not None else "failed")
    group_store = PrefixStore(f"{name}/", base)
    missing, failed = verdict(store, f"{upto}/", list(range(len(slots))),
                               lambda r: liveness.probe(group_store, r), wait_s)
    if not missing and not failed:
        return pg
    if pg is not None:
        pg.abort(f"the grown group '{name}' was not made by every participant")
        _world.forget(pg)
    return None


def grown_world(pg: ProcessGroup, plan: dict[str, Any], is_joiner: bool) -> GrownWorld:
    slots = list(plan["slots"])
    joined = tuple(sorted(slots.index(s) for s in plan["joiners"]))
    source = min(r for r in range(len(slots)) if r not in joined)
    return GrownWorld(pg.rank(), pg.size(), int(plan["previous_world_size"]), joined,
                      is_joiner, source)


__all__ = ["PREFIX", "GrownWorld", "JoinError", "build", "close_to_joiners", "generation_prefix",
           "grown_world", "join_running_job"]

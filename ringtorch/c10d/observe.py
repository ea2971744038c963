"""What ringtorch adds around a job's groups, for groups torch created with backend "ringtorch".

Through ``ringtorch.distributed`` the facade turns these on at ``init_process_group`` and off
at ``destroy_process_group``; through the backend door torch owns the group table, so the door
does it when the first of this process's ringtorch groups is made and when the last one shuts
down: the hang report's responder (over torch's job store), ringrun's ``--trace`` timeline and
the end-of-job summary's totals. The flight recorder and the stall warning are the engine's
and need nothing here. ``DOOR`` is this package's one state object.

Teardown keeps one rule: no rank's teardown waits on the job's store after the last group is
gone, because torch's store client prints every failed round trip to stderr and rank 0 (which
hosts torch's TCPStore under env:// and tcp://) may exit first. So the store host, when its
last group goes, stops every rank's hang-report responder itself (each is parked in a wait on
the store, which would fail loudly once the host exits); a rank whose responder has stopped
gives its observers back without a round trip.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ringtorch._observe import trace_run
from ringtorch._observe.hang_ask import HANG, key, poke
from ringtorch._observe.recorder import RECORDER
from ringtorch._observe.totals import TOTALS


@dataclass
class _Door:
    """The ringtorch groups torch made in this process, by name (nothing else is global)."""

    groups: dict[str, Any] = field(default_factory=dict)
    installed: bool = False
    job: Any = None  # the job's store (torch's, under its prefixes), while installed
    rank: int = -1  # this process's rank in the job, while installed
    size: int = 0


DOOR = _Door()


def _job_store(store: Any) -> Any:
    """The store under torch's prefixes ("default_pg/", then the group's name)."""
    from ringtorch.c10d.torch_store import TorchStore

    torch_store = store.torch_store
    while hasattr(torch_store, "underlying_store"):
        torch_store = torch_store.underlying_store
    return TorchStore(torch_store)


def _groups() -> dict[str, Any]:
    return {name: {"ranks": list(pg.global_ranks), "rank": pg.rank(), "size": pg.size(),
                   "desc": pg.group_desc, "backend": pg.name(),
                   "topology": getattr(pg._get_backend(), "topology", None),
                   "issued": pg._get_sequence_number_for_group()}
            for name, pg in list(DOOR.groups.items())}


def dump() -> dict[str, Any]:
    """This process's flight record, with the door's groups (what a hang report shows)."""
    return RECORDER.dump({"groups": _groups()})


def group_made(engine: Any, store: Any) -> None:
    """A group was made; the first one of the job turns the job-wide observers on."""
    DOOR.groups[engine.group_name] = engine
    if DOOR.installed:
        return
    DOOR.installed = True
    import torch.distributed as dist

    if dist.is_initialized():  # a subgroup of a job whose default group is another backend's
        rank, size = dist.get_rank(), dist.get_world_size()
    else:  # torch is making its default group: this one
        rank, size = engine.rank(), engine.size()
    job = _job_store(store)
    DOOR.job, DOOR.rank, DOOR.size = job, rank, size
    HANG.install(job, rank, size, dump)
    trace_run.start_if_asked(job, rank, size)
    TOTALS.install(rank)


def group_gone(engine: Any) -> None:
    """A group shut down; after the last one, the observers write what they hold and stop."""
    if DOOR.groups.pop(engine.group_name, None) is None or DOOR.groups:
        return
    if DOOR.installed:
        DOOR.installed = False
        trace_run.finish()
        TOTALS.write()
        if DOOR.rank == 0:
            _stop_responders(DOOR.job, DOOR.size)
        DOOR.job = None
        HANG.uninstall()


def _stop_responders(job: Any, size: int) -> None:
    """Hand every other rank's hang-report responder a stop request (rank 0, at teardown).

    Each responder waits on the store for its next request; answering that wait now, while
    this process still hosts the store, lets it end without a failed round trip later. The
    ranks' installations are read from the hang-report keys (one counter per rank).
    """
    # ranks install as often as this one (once per incarnation of the job's groups): a rank
    # already a count ahead has torn down and installed again, and its responder is wanted
    mine = HANG.epoch
    try:
        for rank in range(1, size):
            if mine and job.add(key("installs", rank), 0) == mine:
                poke(job, mine, rank, {"stop": True})
    except Exception:  # the store is already unreachable: nothing left to stop
        pass


__all__ = ["DOOR", "dump", "group_gone", "group_made"]

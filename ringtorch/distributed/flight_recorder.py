"""The flight recorder: what this process's last operations were, on demand.

Every process keeps, always, a bounded ring of its last ``RINGTORCH_FLIGHT_RECORDER``
operations (2000 by default): each collective, point-to-point operation and RPC call with its
group, sequence number, sizes, peer or root, transport and algorithm, the user's call site
and its enqueued/started/finished times and outcome. :func:`dump` returns it as plain JSON
data (the format is in docs/observability.md); the hang report and the timeline are built
from it.

Example::

    import ringtorch.distributed as dist
    from ringtorch.distributed import flight_recorder

    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(4))
    record = flight_recorder.dump()
    last = record["entries"][-1]
    print(last["op"], last["seq"], last["state"], last["site"])   # allreduce 0 completed train.py:5
"""

from __future__ import annotations

import os
from typing import Any

from ringtorch._observe.files import write_json
from ringtorch._observe.recorder import RECORDER
from ringtorch.distributed._world import _world


def _groups() -> dict[str, Any]:
    """The groups this process belongs to: ranks, description, backend, what it runs on."""
    groups: dict[str, Any] = {}
    for pg, name in list(_world.pg_names.items()):
        backend = pg._get_backend()
        groups[name] = {
            "ranks": list(pg.global_ranks), "rank": pg.rank(), "size": pg.size(),
            "desc": pg.group_desc, "backend": pg.name(),
            "topology": getattr(backend, "topology", None),
            "issued": pg._get_sequence_number_for_group(),
        }
    return groups


def dump(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """This process's flight record: its last operations, oldest first, and its groups.

    Args:
        path: also write it there as JSON (written to a temporary name, then renamed, so
            a reader never sees half a file).

    Returns:
        A JSON-serialisable dict: ``format``, ``version``, ``rank``, ``world_size``, ``pid``,
        ``host``, ``capacity``, ``dropped`` (records overwritten so far), ``groups`` and
        ``entries`` (docs/observability.md describes every field).
    """
    record = RECORDER.dump({"groups": _groups()})
    if path is not None:
        write(record, path)
    return record


def write(record: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write ``record`` as JSON at ``path`` atomically (temporary name, then rename)."""
    write_json(record, path)


def enabled() -> bool:
    """Whether this process records (RINGTORCH_FLIGHT_RECORDER is not 0)."""
    return RECORDER.on


def reset(capacity: int | None = None) -> None:
    """Forget every record and keep room for ``capacity`` from now on (None: as before;
    0 turns recording off).

    Raises:
        ValueError: a negative capacity.
    """
    RECORDER.configure(RECORDER.capacity if capacity is None else capacity)


__all__ = ["dump", "enabled", "reset", "write"]

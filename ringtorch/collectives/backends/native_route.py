"""What a recorded collective travelled by: the transport's kind and the algorithm.

The flight recorder asks this only when it is dumped, never while the collective runs: the
answer comes from the same choice table the transport used (every rank chooses alike from
the same call), so recording costs nothing on the hot path and the dump still says exactly
what ran.
"""

from __future__ import annotations

from typing import Any

from ringtorch.collectives.algorithms.select import ALGORITHMS
from ringtorch.collectives.call import CollectiveCall


def route_of(transport: Any, call: CollectiveCall | None) -> tuple[str, str]:
    """(transport kind, algorithm) of ``call`` on ``transport``: "sockets", "shm" or
    "hierarchy", and e.g. "ring", "slots", "shm within hosts, direct between leaders"."""
    topology: Any = getattr(transport, "topology", None)
    kind = "hierarchy" if topology is not None else "shm" if transport.uses_shm else "sockets"
    if call is None:
        return kind, ""
    op, nbytes = call.op, call.nbytes
    if call.shared >= 0:
        return kind, "shared buffer"
    if kind == "sockets":
        return kind, transport.choose(op, nbytes).algorithm if op in ALGORITHMS else "direct"
    if kind == "shm":
        return kind, "sockets: direct" if op == "all_to_all" else "slots"
    between = (transport.sockets.choose_among(op, nbytes, len(topology.leaders)).algorithm
               if op in ALGORITHMS else "direct")
    return kind, f"shm within hosts, {between} between leaders"


__all__ = ["route_of"]

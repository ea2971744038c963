"""``record_comm``: the name torch.profiler shows for the collectives issued inside it.

Every collective and point-to-point operation appears in a torch.profiler trace as a range
named after its backend and collective ("gloo:all_reduce", collectives/profiling.py), with its
sizes as arguments; inside ``record_comm(name)`` the range is called ``name`` instead, as
torch's is. The name holds for the thread that entered the ``with`` block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ringtorch._observe.profiling import COMM_NAMES


@contextlib.contextmanager
def record_comm(name: str) -> Iterator[None]:
    """Profile the collectives issued inside the block under ``name`` (torch's
    ``record_comm``): ``with dist.record_comm("FSDP::all_gather (layer1)"): ...``.

    Raises:
        TypeError: ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise TypeError(f"record_comm expects a str name, got {type(name).__name__}")
    previous = COMM_NAMES.name
    COMM_NAMES.name = name
    try:
        yield
    finally:
        COMM_NAMES.name = previous


__all__ = ["record_comm"]

"""The name ``record_comm`` gives the collectives a thread issues, for torch.profiler.

torch's ``record_comm(name)`` makes every collective issued inside it appear in the profiler
under ``name`` instead of the backend's own title ("gloo:all_reduce"). The name is per thread
(a collective issued by another thread meanwhile keeps its own title) and nests: leaving a
``record_comm`` restores the name that was in force. ``COMM_NAMES`` is this state's one
object; the collectives read it only while a profiler runs.
"""

from __future__ import annotations

import threading


class CommNames(threading.local):
    """The profiling name in force on the current thread (None: the backend's title)."""

    name: str | None = None


COMM_NAMES = CommNames()

__all__ = ["COMM_NAMES", "CommNames"]

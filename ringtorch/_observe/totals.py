"""Running totals of what a rank did, per operation, for the summary printed at a job's end.

The flight recorder's ring forgets: a long job overwrites it many times. The summary needs
the whole job, so each rank keeps, beside the ring, one small accumulator per operation
("allreduce", "send", "rpc_sync", ...): how many calls, how many failed, the bytes they
carried and the nanoseconds spent inside them (from the start stamp to the finish stamp).
:meth:`Totals.add` is a listener of the recorder, run as each record finishes; it costs two
dictionary look-ups and a few additions (``bench/recorder.py`` measures it), so it does not
depend on the ring's capacity and stays cheap for any length of job.

Time inside a collective is the rank's wait for its last peer plus the transfer itself; the
transfer is about the same on every rank, so the rank that spends the least time inside a
collective is the one the others wait for (the straggler). ``ringtorch/_observe/summary.py``
turns the ranks' totals into that verdict; docs/observability.md explains the choice.

Each rank writes its totals as ``summary-<rank>.json`` into ``RINGTORCH_OBSERVE_DIR`` (set
by ringrun) when it starts counting, every ``FLUSH_S`` seconds while they change (from a
daemon thread: a rank killed by a signal runs no exit hook), when its default group is
destroyed and at exit; the launcher merges what it finds. The rule this module keeps, as the
recorder's: it never blocks an operation on anything, and never raises into it. ``TOTALS`` is
the process's one accumulator (this subsystem's state, beside ``RECORDER``).
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time
from threading import get_ident
from typing import Any

from ringtorch import _config
from ringtorch._observe.files import write_json
from ringtorch._observe.recorder import (
    CALL,
    ERROR,
    FINISHED,
    KIND,
    NBYTES,
    OP,
    RECORDER,
    STARTED,
    env_int,
)

FORMAT = "ringtorch-rank-summary"
VERSION = 1
FILE_PREFIX = "summary-"
# How often a rank under ringrun rewrites its file while its totals change (what a killed rank
# leaves is at most this old).
FLUSH_S = 2.0


class Totals:
    """Per-operation totals of this process: for each op, its kind, calls, failed calls,
    bytes and nanoseconds inside."""

    def __init__(self) -> None:
        # Records finish on several threads (the caller's, a group's lane, p2p lanes, RPC
        # callbacks). Each thread adds only to its own table ({op: [kind, calls, failed,
        # bytes, ns]}), so no count is lost and no lock is taken; a snapshot sums them.
        self._by_thread: dict[int, dict[str, list[Any]]] = {}
        self.rank = -1
        self._installed = False
        self._exit_hooked = False
        self.started_ns = time.time_ns()

    def add(self, rec: list[Any]) -> None:
        """Count one finished record (a recorder listener: quick, never raises)."""
        ident = get_ident()
        mine = self._by_thread.get(ident)
        if mine is None:
            mine = self._by_thread[ident] = {}
        acc = mine.get(rec[OP])
        if acc is None:
            acc = mine[rec[OP]] = [rec[KIND], 0, 0, 0, 0]
        nbytes = rec[NBYTES]
        if nbytes < 0:
            call = rec[CALL]
            nbytes = call.nbytes if call is not None and call.nbytes > 0 else 0
        acc[1] += 1
        acc[3] += nbytes
        if rec[STARTED]:
            acc[4] += rec[FINISHED] - rec[STARTED]
        if rec[ERROR]:
            acc[2] += 1

    def ops(self) -> dict[str, dict[str, Any]]:
        """The totals so far, summed over threads: ``{op: {kind, calls, failed, bytes,
        time_ns}}`` (a table being added to while read is read as it stands)."""
        out: dict[str, dict[str, Any]] = {}
        for table in list(self._by_thread.values()):
            for op, acc in list(table.items()):
                kind, calls, failed, nbytes, spent = acc
                entry = out.setdefault(op, {"kind": kind, "calls": 0, "failed": 0,
                                            "bytes": 0, "time_ns": 0})
                entry["calls"] += calls
                entry["failed"] += failed
                entry["bytes"] += nbytes
                entry["time_ns"] += spent
        return out

    def snapshot(self) -> dict[str, Any]:
        """The totals as JSON data (the ``summary-<rank>.json`` format, docs/observability.md)."""
        return {"format": FORMAT, "version": VERSION, "rank": self.rank,
                "world_size": env_int("WORLD_SIZE"), "local_rank": env_int("LOCAL_RANK"),
                "host": socket.gethostname(), "pid": os.getpid(),
                "recording": RECORDER.on, "started_ns": self.started_ns,
                "written_ns": time.time_ns(), "ops": self.ops()}

    def install(self, rank: int) -> None:
        """When ringrun asked for it (``RINGTORCH_OBSERVE_DIR``), count this process's
        operations from now on (once) and write them at exit. Outside ringrun nobody prints
        the summary, so nothing is counted (an operation is cheaper without a listener)."""
        self.rank = rank
        if not _config.OBSERVE_DIR.get():
            return
        if not self._installed:
            self._installed = True
            self.started_ns = time.time_ns()
            RECORDER.listeners.append(self.add)
        if not self._exit_hooked:
            self._exit_hooked = True
            atexit.register(self.write)
            threading.Thread(target=self._flush_every, args=(FLUSH_S,), daemon=True,
                             name="ringtorch-summary").start()

    def _flush_every(self, seconds: float) -> None:
        """Write the file now and then whenever the totals changed: a rank that is killed
        (ringrun stops the others with SIGTERM when one fails) runs no exit hook, and its
        last flush is what the summary shows of it."""
        written = -1
        while True:
            calls = sum(acc[1] for table in list(self._by_thread.values())
                        for acc in list(table.values()))
            if calls != written:
                written = calls
                self.write()
            time.sleep(seconds)

    def write(self) -> str | None:
        """Write ``summary-<rank>.json`` into RINGTORCH_OBSERVE_DIR; its path, or None when
        there is no folder or no rank (never raises: it runs at exit and at teardown)."""
        folder = _config.OBSERVE_DIR.get()
        if not folder or self.rank < 0:
            return None
        target = os.path.join(folder, f"{FILE_PREFIX}{self.rank}.json")
        try:
            write_json(self.snapshot(), target)  # the flusher and exit may overlap: it copes
        except OSError:
            return None
        return target


TOTALS = Totals()

__all__ = ["FILE_PREFIX", "FORMAT", "TOTALS", "VERSION", "Totals"]

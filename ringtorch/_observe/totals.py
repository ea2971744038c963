"""Running totals of what a rank did, per operation, for the summary printed at a job's end.

The flight recorder's ring forgets: a long job overwrites it many times. The summary needs
the whole job, so each rank keeps, beside the ring, one small accumulator per operation
("allreduce", "send", "rpc_sync", ...): how many calls, how many failed, the bytes they
carried and the time spent inside them (from the start stamp to the finish stamp).
:meth:`Totals.add_all` gets the finished records from the recorder in batches, every
``COUNT_EVERY`` operations (see ``FlightRecorder.count_with``), and adds them up as runs of
one operation, a few additions each (``bench/recorder.py`` measures it), so it stays cheap
for any length of job.

Time inside a collective is the rank's wait for its last peer plus the transfer itself; the
transfer is about the same on every rank, so the rank that spends the least time inside a
collective is the one the others wait for (the straggler). ``ringtorch/_observe/summary.py``
turns the ranks' totals into that verdict; docs/observability.md explains the choice.

Each rank writes its totals as ``summary-<rank>.json`` into ``RINGTORCH_OBSERVE_DIR`` (set
by ringrun) when it starts counting, every ``FLUSH_S`` seconds while they change (from a
daemon thread: a rank killed by a signal runs no exit hook), when its default group is
destroyed and at exit; the launcher merges what it finds. The rule this module keeps, as the
recorder's: it never blocks an operation on anything slow (a snapshot holds the recorder's
count lock for tens of microseconds), and never raises into it. ``TOTALS`` is
the process's one accumulator (this subsystem's state, beside ``RECORDER``).
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import time
from typing import Any

from ringtorch import _config
from ringtorch._observe.files import write_json
from ringtorch._observe.operation import Operation
from ringtorch._observe.recorder import RECORDER, FlightRecorder, env_int

FORMAT = "ringtorch-rank-summary"
VERSION = 1
FILE_PREFIX = "summary-"
# How often a rank under ringrun rewrites its file while its totals change (what a killed rank
# leaves is at most this old).
FLUSH_S = 2.0


class Totals:
    """Per-operation totals of this process: for each op, its kind, calls, failed calls,
    bytes and nanoseconds inside."""

    def __init__(self, recorder: FlightRecorder = RECORDER) -> None:
        self._recorder = recorder
        # {op: [kind, calls, failed, bytes, seconds]}: added to only by add_all, which the
        # recorder calls under its lock (never on two threads at once).
        self._table: dict[str, list[Any]] = {}
        self.rank = -1
        self._installed = False
        self._exit_hooked = False
        self.started_ns = time.time_ns()

    def add_all(self, records: list[Operation]) -> None:
        """Count finished records (the recorder hands them over in batches: see
        ``FlightRecorder.count_with``; quick, never raises)."""
        self._add_to(self._table, records)

    @staticmethod
    def _add_to(table: dict[str, list[Any]], records: list[Operation]) -> None:
        """Add ``records`` to ``table``.

        A batch is mostly runs of one operation (a training loop's all_reduces), so the sums
        of a run are kept in local variables and added to the table's entry when the
        operation changes: an addition to a local costs a third of one to a list's item,
        and this loop runs for every record (``bench/recorder.py`` measures it)."""
        run: str | None = None
        kind, calls, failed, nbytes, spent = "", 0, 0, 0, 0.0
        for rec in records:
            if rec.op is not run:  # op names are the code's literals: one object each
                if run is not None:
                    _add_run(table, run, kind, calls, failed, nbytes, spent)
                run, kind, calls, failed, nbytes, spent = rec.op, rec.kind, 0, 0, 0, 0.0
            size = rec.nbytes
            if size < 0:  # a collective's size is its call's; an RPC's is not known
                call = rec.call  # (nor is the size of a call the MPI backend leaves at -1)
                size = call.nbytes if call is not None and call.nbytes > 0 else 0
            calls += 1
            nbytes += size
            started = rec.started
            if started:  # a record that never started spent no time inside
                spent += rec.finished - started
            if rec.error:
                failed += 1
        if run is not None:
            _add_run(table, run, kind, calls, failed, nbytes, spent)

    def ops(self) -> dict[str, dict[str, Any]]:
        """The totals so far: ``{op: {kind, calls, failed, bytes, time_ns}}``: those handed
        over, and the records finished since (asked of the recorder)."""
        with self._recorder.count_lock:  # no hand-over meanwhile: each record counts once
            table = {op: list(acc) for op, acc in self._table.items()}
            if self._recorder.counter == self.add_all:  # it counts for this one
                self._add_to(table, self._recorder.uncounted())
        return {op: {"kind": kind, "calls": calls, "failed": failed, "bytes": nbytes,
                     "time_ns": round(spent * 1e9)}
                for op, (kind, calls, failed, nbytes, spent) in table.items()}

    def snapshot(self) -> dict[str, Any]:
        """The totals as JSON data (the ``summary-<rank>.json`` format, docs/observability.md)."""
        return {"format": FORMAT, "version": VERSION, "rank": self.rank,
                "world_size": env_int("WORLD_SIZE"), "local_rank": env_int("LOCAL_RANK"),
                "host": socket.gethostname(), "pid": os.getpid(),
                "recording": self._recorder.on, "started_ns": self.started_ns,
                "written_ns": time.time_ns(), "ops": self.ops()}

    def start_counting(self) -> None:
        """Count every operation the recorder records from now on."""
        self._recorder.count_with(self.add_all)

    def install(self, rank: int) -> None:
        """When ringrun asked for it (``RINGTORCH_OBSERVE_DIR``), count this process's
        operations from now on (once) and write them at exit. Outside ringrun nobody prints
        the summary, so nothing is counted (an operation is cheaper without a counter)."""
        self.rank = rank
        if not _config.OBSERVE_DIR.get():
            return
        if not self._installed:
            self._installed = True
            self.started_ns = time.time_ns()
            self.start_counting()
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
            calls = sum(entry["calls"] for entry in self.ops().values())
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


def _add_run(table: dict[str, list[Any]], op: str, kind: str, calls: int, failed: int,
             nbytes: int, spent: float) -> None:
    """Add the sums of a run of records of ``op`` to its entry of ``table``."""
    acc = table.get(op)
    if acc is None:
        table[op] = [kind, calls, failed, nbytes, spent]
        return
    acc[1] += calls
    acc[2] += failed
    acc[3] += nbytes
    acc[4] += spent


TOTALS = Totals()

__all__ = ["FILE_PREFIX", "FORMAT", "TOTALS", "VERSION", "Totals"]

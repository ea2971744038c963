"""When a rank's timeline starts and ends, and who merges the ranks' files.

``start_if_asked`` runs as the first process group (or RPC agent) of a process comes up:
when ``RINGTORCH_TRACE`` names a folder it aligns the clock through the job's store
(clock.py, every rank takes part) and starts the tracer. ``finish`` runs at
``destroy_process_group`` and at exit: it writes this rank's file when new events came in.

Who merges: under ringrun (``RINGTORCH_OBSERVE_DIR`` is set) the ranks write into the
attempt's observe folder and the launcher merges into ``DIR/trace.json`` when the workers have
ended. Without a launcher the ranks write ``DIR/trace-<rank>.json`` and rank 0 merges as it
finishes, waiting up to ``RINGTORCH_TRACE_MERGE_WAIT_S`` for the other ranks' files of this run;
``python -m ringtorch.distributed.trace DIR`` merges again whenever asked.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from ringtorch import _config
from ringtorch._observe import clock, trace_merge
from ringtorch._observe.recorder import RECORDER
from ringtorch._observe.trace import TRACER

# With the flight recorder off (RINGTORCH_FLIGHT_RECORDER=0) operations are not recorded at
# all; tracing needs their records, so it turns the recorder on with this small ring.
_RING_FOR_TRACING = 64


def start_if_asked(store: Any, rank: int, world_size: int) -> bool:
    """Start tracing if ``RINGTORCH_TRACE`` asks for it and it is not on already (every rank
    of the job calls this at the same point: the clock is aligned through ``store``; None:
    the ranks share no store, as with the MPI backend, and the clocks are taken as they are).

    Returns:
        Whether tracing is on.
    """
    directory = _config.TRACE.get()
    if not directory or TRACER.on:
        return TRACER.on
    target = _config.OBSERVE_DIR.get() or directory
    os.makedirs(target, exist_ok=True)
    if not RECORDER.on:
        RECORDER.configure(_RING_FOR_TRACING)
    # On before the clock exchange, which returns on rank 0 only when every rank is past
    # this line: no rank's first operation can reach a peer that does not trace yet.
    TRACER.start(target, rank, world_size, clock.unaligned(), clock.UNALIGNED_RUN)
    if store is not None:
        TRACER.clock, TRACER.run_id = clock.align(store, rank, world_size)
    atexit.unregister(finish)  # once per process, however often tracing starts
    atexit.register(finish)
    return True


def finish() -> str | None:
    """Write this rank's file if anything new was traced; rank 0 without a launcher then
    merges. Never raises (it runs at exit and in destroy_process_group).

    Returns:
        The merged file's path when this call merged, else None.
    """
    if TRACER.rank < 0 or not TRACER.changed():
        return None
    try:
        TRACER.write()
        if TRACER.rank != 0 or _config.OBSERVE_DIR.get():
            return None
        merged, ranks = trace_merge.merge_directory(
            TRACER.directory, run_id=TRACER.run_id, expect=TRACER.world_size,
            wait_s=_config.TRACE_MERGE_WAIT_S.get())
        if len(ranks) < TRACER.world_size:
            missing = sorted(set(range(TRACER.world_size)) - set(ranks))
            print(f"ringtorch: the timeline {merged} lacks rank(s) {missing}: their trace "
                  f"files did not appear within RINGTORCH_TRACE_MERGE_WAIT_S; merge again "
                  f"with python -m ringtorch.distributed.trace {TRACER.directory}",
                  file=sys.stderr, flush=True)
        return merged
    except Exception as exc:  # a full disk must not turn a finished job into a failed one
        print(f"ringtorch: could not write the timeline: {exc}", file=sys.stderr, flush=True)
        return None


__all__ = ["finish", "start_if_asked"]

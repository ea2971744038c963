"""The timeline: every rank's collectives, point-to-point operations, RPC requests and DDP
buckets as one Chrome trace (``trace.json``, opened by https://ui.perfetto.dev or
chrome://tracing), one process per rank, on rank 0's clock.

Turn it on with ``ringrun --trace DIR`` or, for jobs started otherwise, ``RINGTORCH_TRACE=DIR``
(docs/timeline.md). This module is the rank's side: ``init_process_group`` starts tracing
(:func:`start`), ``destroy_process_group`` and the end of the process write the rank's file
(:func:`finish`), and the layers above record their own spans through :func:`span`,
:func:`instant` and :func:`async_span`, which cost one attribute check when tracing is off.
Run as a program it merges a folder of per-rank files::

    python -m ringtorch.distributed.trace DIR        # writes DIR/trace.json

Example::

    # RINGTORCH_TRACE=/tmp/tl python train.py   (every rank), or: ringrun --trace /tmp/tl ...
    import torch
    import ringtorch.distributed as dist
    from ringtorch.distributed import trace

    dist.init_process_group("gloo")                   # the clocks are aligned here
    start = trace.now()
    dist.all_reduce(torch.ones(4))
    trace.span("user", "my step", start, trace.now())  # a span of your own, on this thread
    dist.destroy_process_group()                      # rank 0 writes /tmp/tl/trace.json
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

from ringtorch._observe import trace_merge, trace_run
from ringtorch._observe.trace import TRACER

now = time.monotonic_ns  # the clock every span of the timeline is given in


def enabled() -> bool:
    """Whether this process is tracing now."""
    return TRACER.on


def start(store: Any, rank: int, world_size: int) -> bool:
    """Start tracing if ``RINGTORCH_TRACE`` asks for it (every rank calls this together:
    the clocks are aligned through ``store``); whether tracing is on."""
    return trace_run.start_if_asked(store, rank, world_size)


def finish() -> str | None:
    """Write this rank's trace file if new events came in; without a launcher, rank 0 then
    merges the ranks' files. The merged file's path when this call wrote it, else None."""
    return trace_run.finish()


def span(cat: str, name: str, start_ns: int, end_ns: int, **args: Any) -> None:
    """A span on this thread from ``start_ns`` to ``end_ns`` (:func:`now` stamps)."""
    if TRACER.on:
        TRACER.span(cat, name, start_ns, end_ns, args)


def instant(cat: str, name: str, **args: Any) -> None:
    """A moment on this thread, now."""
    if TRACER.on:
        TRACER.instant(cat, name, args)


def async_span(cat: str, name: str, start_ns: int, end_ns: int, **args: Any) -> None:
    """An interval that may overlap others (a track of its own): an operation in flight."""
    if TRACER.on:
        TRACER.async_span(cat, name, start_ns, end_ns, args)


def merge(directory: str, out: str | None = None) -> tuple[str | None, list[int]]:
    """Merge the ``trace-<rank>.json`` files of ``directory`` into ``out`` (default
    ``directory/trace.json``); returns (the merged file or None if there was none, its ranks)."""
    return trace_merge.merge_directory(directory, out)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ringtorch.distributed.trace DIR [--out FILE]``; the exit code."""
    parser = argparse.ArgumentParser(prog="python -m ringtorch.distributed.trace",
                                     description="Merge the ranks' trace files of DIR into "
                                                 "one Chrome trace.")
    parser.add_argument("directory", help="the folder holding trace-<rank>.json files")
    parser.add_argument("--out", default=None, help="the merged file (default DIR/trace.json)")
    args = parser.parse_args(argv)
    path, ranks = merge(args.directory, args.out)
    if path is None:
        print(f"no trace-<rank>.json files in {args.directory}", file=sys.stderr)
        return 1
    print(f"{path}: ranks {ranks}")
    return 0


__all__ = ["async_span", "enabled", "finish", "instant", "main", "merge", "now", "span",
           "start"]

if __name__ == "__main__":
    sys.exit(main())

"""Joining the ranks' trace files into the one ``trace.json`` that Perfetto and chrome://tracing open.

Every rank's file is already a complete trace on rank 0's clock (trace.py), with the rank as
its process id, so merging is a concatenation: the events of every file, and the union of
their ``otherData["ranks"]`` (each rank's host, pid, clock offset and error bound, kept and
dropped events). A merged file can be merged again (say, the traces of several nodes). The
merged metadata states the alignment: the largest error bound of any rank, in words and in
numbers. Files of another run (a different ``run_id`` than asked for) are left out, so a
stale file of an earlier job in the same folder does not creep in.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from typing import Any

from ringtorch._observe.trace import FORMAT, VERSION, write_json

MERGED_NAME = "trace.json"
# trace-<rank>.json: one rank's file; trace-node<N>.json: the ranks of node N, merged by its
# launcher (jobs of several nodes)
_PART_FILE = re.compile(r"^trace-(node)?(\d+)\.json$")


def part_files(directory: str) -> list[str]:
    """The per-rank and per-node trace files in ``directory``, sorted by name."""
    return sorted(path for path in glob.glob(os.path.join(directory, "trace-*.json"))
                  if _PART_FILE.match(os.path.basename(path)))


def node_file_name(node: int) -> str:
    """The name a launcher of node ``node`` > 0 gives its merged file (node 0: trace.json)."""
    return f"trace-node{node}.json"


def read(path: str) -> dict[str, Any] | None:
    """A trace file's content, or None when it is not one of ours (or not JSON)."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("otherData", {}).get("format") != FORMAT:
        return None
    return doc


def merge(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """One trace of ``documents`` (per-rank or already merged files of one run)."""
    events: list[dict[str, Any]] = []
    ranks: dict[str, Any] = {}
    run_ids = set()
    world_size = -1
    for doc in documents:
        other = doc.get("otherData", {})
        theirs = set(other.get("ranks", {}))
        if theirs and theirs <= set(ranks):
            continue  # these ranks came already (a rank's file beside its node's merge)
        events.extend(doc.get("traceEvents", []))
        ranks.update(other.get("ranks", {}))
        run_ids.add(other.get("run_id", ""))
        world_size = max(world_size, int(other.get("world_size", -1)))
    bounds = [int(r["clock"]["error_bound_ns"]) for r in ranks.values()]
    bound_ns = max(bounds, default=0)
    missing = ([r for r in range(world_size) if str(r) not in ranks]
               if world_size > 0 else [])
    if -1 in bounds:
        alignment = ("the ranks shared no store (MPI backend), so their clocks were not "
                     "measured: each rank's CLOCK_MONOTONIC is used as it is, which all "
                     "processes of one host share; ranks on different hosts are not aligned")
    else:
        alignment = (f"each rank's clock was measured against rank 0's through the store at "
                     f"start-up; every timestamp is within {bound_ns / 1000.0:.1f} us of "
                     f"rank 0's time")
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {
                "format": FORMAT, "version": VERSION, "run_id": ",".join(sorted(run_ids)),
                "world_size": world_size, "ranks": dict(sorted(ranks.items(),
                                                               key=lambda kv: int(kv[0]))),
                "missing_ranks": missing,
                "clock_error_bound_us": None if -1 in bounds else bound_ns / 1000.0,
                "alignment": alignment,
            }}


def merge_directory(directory: str, out_path: str | None = None, run_id: str | None = None,
                    expect: int = 0, wait_s: float = 0.0) -> tuple[str | None, list[int]]:
    """Merge the per-rank (and per-node) files of ``directory`` into ``out_path`` (default
    ``directory/trace.json``).

    Args:
        run_id: only files of this run (None: any).
        expect: the number of ranks to wait for (0: take what is there).
        wait_s: how long to wait for the ``expect`` ranks' files to appear.

    Returns:
        (the merged file's path, or None when there was nothing to merge; the ranks merged).
    """
    deadline = time.monotonic() + wait_s
    while True:
        docs, ranks = [], set()
        for path in part_files(directory):
            doc = read(path)
            if doc is not None and (run_id is None
                                    or doc["otherData"].get("run_id") == run_id):
                docs.append(doc)
                ranks.update(int(r) for r in doc["otherData"].get("ranks", {}))
        if len(ranks) >= expect or time.monotonic() >= deadline:
            break
        time.sleep(0.05)  # other processes write these files; there is nothing to wait on
    if not docs:
        return None, []
    merged = merge(docs)
    target = out_path or os.path.join(directory, MERGED_NAME)
    write_json(merged, target)
    return target, sorted(ranks)


__all__ = ["MERGED_NAME", "merge", "merge_directory", "node_file_name", "part_files", "read"]

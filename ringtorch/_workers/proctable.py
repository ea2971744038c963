"""Read the process table (Linux ``/proc``): who is in a process group, who are our children.

Teardown uses it to wait until a worker's whole process group is gone, not only the worker,
and to find descendants that were reparented to a subreaper supervisor. Where ``/proc`` does
not exist the functions return empty results, and teardown falls back to the workers alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcEntry:
    """One row of the process table."""

    pid: int
    ppid: int
    pgid: int
    state: str  # "R", "S", "Z" (zombie), ...


def _read_entry(pid: int) -> ProcEntry | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
    fields = raw[raw.rfind(")") + 2:].split()
    if len(fields) < 3:
        return None
    return ProcEntry(pid=pid, ppid=int(fields[1]), pgid=int(fields[2]), state=fields[0])


def snapshot() -> list[ProcEntry]:
    """Every process visible in ``/proc`` right now (empty where there is no ``/proc``)."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    entries = []
    for name in names:
        if name.isdigit():
            entry = _read_entry(int(name))
            if entry is not None:
                entries.append(entry)
    return entries


def live_members(pgids: set[int], table: list[ProcEntry] | None = None) -> list[ProcEntry]:
    """Processes in any of the process groups ``pgids`` that are not zombies."""
    table = snapshot() if table is None else table
    return [e for e in table if e.pgid in pgids and e.state != "Z"]


def children_of(pid: int, table: list[ProcEntry] | None = None) -> list[ProcEntry]:
    """The direct children of ``pid``, zombies included (they still need reaping)."""
    table = snapshot() if table is None else table
    return [e for e in table if e.ppid == pid]


def descendants_of(pid: int, table: list[ProcEntry] | None = None) -> list[ProcEntry]:
    """Every descendant of ``pid`` (children, their children, ...), zombies included."""
    table = snapshot() if table is None else table
    by_parent: dict[int, list[ProcEntry]] = {}
    for entry in table:
        by_parent.setdefault(entry.ppid, []).append(entry)
    found, frontier = [], [pid]
    while frontier:
        for child in by_parent.get(frontier.pop(), []):
            found.append(child)
            frontier.append(child.pid)
    return found


__all__ = ["ProcEntry", "children_of", "descendants_of", "live_members", "snapshot"]

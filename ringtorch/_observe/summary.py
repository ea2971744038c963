"""The end-of-job summary: the ranks' running totals merged into a few lines.

Each rank leaves ``summary-<rank>.json`` (``ringtorch/_observe/totals.py``); this module
reads them, names the straggler of each collective and formats what ringrun prints: per
rank, the time spent inside collectives and the bytes they carried (and the same for
point-to-point and RPC when the job used them); per collective, the slowest rank and how
long the others waited for it.

How the straggler is found, without comparing clocks: a rank's time inside a collective is
its wait for the last rank to arrive plus the transfer, and the transfer costs every rank
about the same. The rank that arrives last waits least, so the straggler of an operation is
the rank with the smallest mean time per call inside it, and its lag is the others' median
time per call minus its own. Clocks of different hosts never enter, so the verdict holds
across nodes as well as on one. The rule this module keeps: it only reads and formats (no
torch, nothing of ringtorch beyond ``_observe``), so the launcher can use it, and a missing
or damaged file is reported, never fatal.
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass
from typing import Any

from ringtorch._observe.totals import FILE_PREFIX, FORMAT

KINDS = (("collective", "collectives"), ("p2p", "p2p"), ("rpc", "RPC"))

# Collectives whose root does different work from the others (it sends, or collects, while
# the others do the opposite): time inside them differs by role, not only by waiting, so no
# straggler is named from them.
ROOTED = frozenset({"broadcast", "reduce", "gather", "scatter", "monitored_barrier"})


@dataclass(frozen=True)
class Straggler:
    """The slowest rank of one collective: ``rank`` spent ``own_ns`` per call inside it, the
    others ``others_ns`` (their median), over ``calls`` calls (the straggler's count)."""

    op: str
    rank: int
    own_ns: float
    others_ns: float
    calls: int

    @property
    def lag_ns(self) -> float:
        """How long, per call, the others waited for ``rank`` (never negative)."""
        return max(0.0, self.others_ns - self.own_ns)


def read_summaries(folder: str) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """The rank summaries found in ``folder``: ``({rank: summary}, [problems])``; a file
    that cannot be read or is not a summary is named in the problems, not raised."""
    found: dict[int, dict[str, Any]] = {}
    problems: list[str] = []
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return found, problems
    for name in names:
        if not (name.startswith(FILE_PREFIX) and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(folder, name)) as f:
                data = json.load(f)
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}")
            found[int(data["rank"])] = data
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            problems.append(f"{name} unreadable ({type(exc).__name__}: {exc})")
    return found, problems


def stragglers(summaries: dict[int, dict[str, Any]]) -> list[Straggler]:
    """For each collective without a root (ROOTED) that at least two ranks ran, the rank the
    others waited for."""
    per_op: dict[str, dict[int, tuple[float, int]]] = {}
    for rank, data in summaries.items():
        for op, entry in data.get("ops", {}).items():
            if (entry.get("kind") == "collective" and entry.get("calls", 0) > 0
                    and op not in ROOTED):
                per_op.setdefault(op, {})[rank] = (entry["time_ns"] / entry["calls"],
                                                   entry["calls"])
    found = []
    for op in sorted(per_op):
        ranks = per_op[op]
        if len(ranks) < 2:
            continue
        slow = min(ranks, key=lambda r: (ranks[r][0], r))
        others = statistics.median(t for r, (t, _) in ranks.items() if r != slow)
        found.append(Straggler(op, slow, ranks[slow][0], others, ranks[slow][1]))
    return found


def format_seconds(ns: float) -> str:
    """``"1.52 s"``, ``"48.3 ms"``, ``"210 us"``: three significant figures or so."""
    s = ns / 1e9
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def format_bytes(n: float) -> str:
    """``"4.0 MiB"``, ``"512 B"``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _rank_line(rank: int, data: dict[str, Any]) -> str:
    parts = []
    lifetime = data.get("written_ns", 0) - data.get("started_ns", 0)
    for kind, title in KINDS:
        entries = [e for e in data.get("ops", {}).values() if e.get("kind") == kind]
        if not entries:
            continue
        spent = sum(e["time_ns"] for e in entries)
        calls = sum(e["calls"] for e in entries)
        failed = sum(e["failed"] for e in entries)
        text = (f"{title} {format_seconds(spent)} ({_count(calls, 'call')}, "
                f"{format_bytes(sum(e['bytes'] for e in entries))}")
        if failed:
            text += f", {failed} failed"
        parts.append(text + ")")
    since = f"{format_seconds(lifetime)} since init" if lifetime > 0 else ""
    if not data.get("recording", True) and not parts:
        return f"  rank {rank}: not recorded (RINGTORCH_FLIGHT_RECORDER=0)"
    if not parts:
        return f"  rank {rank}: no collective, p2p or RPC call" + (f" in {since}" if since else "")
    return f"  rank {rank}: " + ", ".join(parts) + (f" of {since}" if since else "")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _straggler_line(s: Straggler) -> str:
    return (f"  {s.op}: slowest rank {s.rank}: the others waited {format_seconds(s.lag_ns)} "
            f"per call for it ({format_seconds(s.lag_ns * s.calls)} over "
            f"{_count(s.calls, 'call')}; per call it spent {format_seconds(s.own_ns)} inside, "
            f"the others {format_seconds(s.others_ns)})")


def format_summary(summaries: dict[int, dict[str, Any]], expected: list[int] | None = None,
                   problems: list[str] | None = None) -> str:
    """The summary text: a title, one line per rank, one per collective's straggler, and
    which of the ``expected`` ranks left no summary. Empty when no rank left one."""
    if not summaries:
        return ""
    ranks = sorted(summaries)
    lines = [f"job summary ({_count(len(ranks), 'rank')}: time inside operations, calls, "
             f"bytes passed; the slowest rank of each collective)"]
    lines += [_rank_line(rank, summaries[rank]) for rank in ranks]
    lines += [_straggler_line(s) for s in stragglers(summaries)]
    missing = sorted(set(expected or ()) - set(ranks))
    if missing:
        many = len(missing) > 1
        it, was = ("they", "were") if many else ("it", "was")
        lines.append(f"  no summary from rank{'s' if many else ''} "
                     f"{', '.join(map(str, missing))} ({it} exited before initializing a "
                     f"process group, or {it} {was} killed)")
    lines += [f"  {problem}" for problem in problems or ()]
    return "\n".join(lines)


__all__ = ["Straggler", "format_bytes", "format_seconds", "format_summary", "read_summaries",
           "stragglers"]

"""The cross-rank hang report: every rank's flight record and stacks, merged into one text.

``analyse(answers)`` is a pure function of what the ranks sent (their flight records, the
dumps of ``flight_recorder.dump()``, and their stacks in faulthandler's format), so it can be
tested on made-up dumps and run anywhere: in the rank that timed out, in the launcher, in
``python -m ringtorch.distributed.debug``. ``format_report`` turns its result into the text
users read. Nothing here talks to a process; hang_ask.py does that.

The rule this module keeps: a report states only what the dumps show. A rank that did not
answer is named as such, never guessed at, and every claim ("rank 2 did not arrive at
allreduce #5") comes from a record some rank wrote.

Example (rank 0 is in all_reduce #0, rank 1 never called it)::

    from ringtorch._observe.hang_report import Answer, analyse, format_report

    entry = {"kind": "collective", "group": "0", "op": "allreduce", "seq": 0,
             "state": "running", "nbytes": 64}
    answers = [Answer(0, {"entries": [entry], "groups": {"0": {"ranks": [0, 1]}}}),
               Answer(1, {"entries": [], "groups": {}})]
    print(format_report(analyse(answers, world_size=2, reason="example")))
    # ... first divergence: allreduce #0 (64 bytes): ranks [1] did not arrive; ...
    # everybody waits for: ranks [1]
"""

from __future__ import annotations

import os
import re
import sysconfig
import time
from dataclasses import dataclass, field
from typing import Any

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
STACK_FRAMES = 8  # frames shown per thread (innermost first)


@dataclass
class Answer:
    """What one rank gave (or did not give) to a hang-report request.

    Attributes:
        rank: the global rank.
        flight: its flight record (``flight_recorder.dump()``), None if it did not answer.
        stacks: the Python stacks of its threads in faulthandler's format ("" if none came).
        main_thread: the main thread's id as faulthandler writes it ("0x7f..."), if known.
        host, pid: where the rank runs, if it published them.
        note: how the stacks were obtained or why nothing came ("did not answer within 3 s").
        name: its RPC worker name ("" if it has none).
        now: its rank in the job's current world when that differs from ``rank`` (the job
            shrank or grew back, see docs/recovery.md), else -1.
    """

    rank: int
    flight: dict[str, Any] | None = None
    stacks: str = ""
    main_thread: str = ""
    host: str = ""
    pid: int = -1
    note: str = ""
    name: str = ""
    now: int = -1


@dataclass
class Thread:
    """One thread of a faulthandler dump: its id and frames, innermost first."""

    ident: str
    current: bool
    frames: list[tuple[str, int, str]] = field(default_factory=list)


def parse_stacks(text: str) -> list[Thread]:
    """The threads of the LAST dump in ``text`` (faulthandler appends one dump per signal;
    a dump's first thread is the "Current thread" or, from dump_traceback, any thread)."""
    dumps: list[list[Thread]] = []
    current: list[Thread] = []
    seen: set[str] = set()
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            ident = head.group(2)
            if ident in seen:  # the same thread again: a new dump has begun
                dumps.append(current)
                current, seen = [], set()
            seen.add(ident)
            current.append(Thread(ident, head.group(1) == "Current thread"))
            continue
        frame = _FRAME.match(line)
        if frame and current:
            current[-1].frames.append((frame.group(1), int(frame.group(2)), frame.group(3)))
    if current:
        dumps.append(current)
    return dumps[-1] if dumps else []


def is_library(path: str) -> bool:
    """Whether a frame's file is ringtorch's, torch's or the standard library's (a user
    reading a hang wants their own frames first)."""
    return (path.startswith(_PACKAGE) or path.startswith(_STDLIB) or "/site-packages/" in path
            or path.startswith("<"))


def useful_frames(thread: Thread, limit: int = STACK_FRAMES) -> list[tuple[str, int, str]]:
    """The frames worth reading, innermost first: the innermost frame (what the thread does
    now, even inside a library), then the user's own frames."""
    if not thread.frames:
        return []
    kept = [thread.frames[0]]
    kept += [f for f in thread.frames[1:] if not is_library(f[0])]
    return kept[:limit]


def _user_threads(answer: Answer) -> list[Thread]:
    """The main thread first, then threads running user code; library threads (the
    store server, p2p readers, the hang-report responder) are left out."""
    threads = parse_stacks(answer.stacks)
    main = [t for t in threads if answer.main_thread and int(t.ident, 16) == int(
        answer.main_thread, 16)]
    if not main and threads:  # unknown main thread: faulthandler lists it last
        main = [threads[-1]]
    others = [t for t in threads if t not in main
              and any(not is_library(f[0]) for f in t.frames)]
    return main + others


def _entry_size(entry: dict[str, Any]) -> int:
    call = entry.get("call") or {}
    size = call.get("nbytes", -1)
    return size if isinstance(size, int) and size >= 0 else int(entry.get("nbytes", -1))


def _describe(entry: dict[str, Any]) -> str:
    call = entry.get("call") or {}
    parts = [f"{_entry_size(entry)} bytes"] if _entry_size(entry) >= 0 else []
    if call.get("dtype"):
        parts.append(str(call["dtype"]))
    if call.get("root", -1) not in (-1, None):
        parts.append(f"root {call['root']}")
    inner = f" ({', '.join(parts)})" if parts else ""
    parent = entry.get("parent")
    within = f" of {parent['op']}" if isinstance(parent, dict) and parent.get("op") else ""
    return f"{entry['op']} #{entry['seq']}{inner}{within}"


def _site(entry: dict[str, Any]) -> str:
    return f" at {entry['site']}" if entry.get("site") else ""


def analyse(answers: list[Answer], world_size: int, reason: str,
            ranks: list[int] | None = None) -> dict[str, Any]:
    """Merge the ranks' answers into the facts a report states (a JSON-serialisable dict).

    Ranks are the ones each process was started as (its flight record's group members are
    numbered so); ``ranks`` are the ranks asked (default: ``range(world_size)``), and a rank
    whose answer gives its number in a shrunk or grown world (``Answer.now``) is named by both.

    Returns: ``reason``, ``world_size``, ``silent`` (ranks that gave no flight record, with
    why), ``groups`` (per group: members, each rank's position, the first divergent sequence
    number, the ranks that did not arrive there and the ranks waiting), ``mismatches``,
    ``rpc`` (RPC calls still in flight), ``culprits`` (the ranks the others wait for),
    ``stacks`` (per rank, the useful frames of its interesting threads) and ``renumbered``
    (rank -> its number in the current world, where they differ).
    """
    by_rank = {a.rank: a for a in answers}
    silent = {a.rank: a.note or "did not answer" for a in answers if a.flight is None}
    for rank in range(world_size) if ranks is None else ranks:
        if rank not in by_rank:
            silent[rank] = "did not publish where it runs (no process group yet?)"
    groups: dict[str, dict[str, Any]] = {}
    per_group: dict[str, dict[int, dict[int, dict[str, Any]]]] = {}
    rpc: list[dict[str, Any]] = []
    for answer in answers:
        if answer.flight is None:
            continue
        for name, info in (answer.flight.get("groups") or {}).items():
            groups.setdefault(name, {"ranks": list(info.get("ranks", [])),
                                     "desc": info.get("desc", "")})
        for entry in answer.flight.get("entries", []):
            if entry.get("kind") == "collective" and entry.get("seq", -1) >= 0:
                per_group.setdefault(entry["group"], {}).setdefault(answer.rank, {})[
                    entry["seq"]] = entry
            elif entry.get("kind") == "rpc" and entry.get("state") in ("queued", "running"):
                rpc.append({"rank": answer.rank, "op": entry["op"], "to": entry.get("peer"),
                            "function": entry.get("detail", ""), "site": entry.get("site"),
                            "since_ns": entry.get("enqueued_ns")})
    out_groups, mismatches, culprits = {}, [], set()
    for name in sorted(set(groups) | set(per_group), key=_group_key):
        members = groups.get(name, {}).get("ranks") or sorted(per_group.get(name, {}))
        seen = per_group.get(name, {})
        verdict = _group_verdict(name, members, seen, silent)
        verdict["gone"] = name not in groups  # its records outlived it (shrunk, destroyed)
        out_groups[name] = verdict
        mismatches += verdict.pop("mismatches")
        if not verdict["gone"]:  # a rank behind in a shrunk-away group holds nobody up now
            culprits.update(verdict["late"])
    stacks = {}
    for answer in answers:
        threads = _user_threads(answer)
        stacks[answer.rank] = [{"thread": t.ident, "main": i == 0,
                                "frames": [list(f) for f in useful_frames(t)]}
                               for i, t in enumerate(threads[:3])]
    names = {a.name: a.rank for a in answers if a.name}
    for call in rpc:  # the callee of an RPC in flight is what its caller waits for
        call["to_rank"] = names.get(str(call["to"]))
        if not culprits and call["to_rank"] is not None:
            culprits.add(call["to_rank"])
    if not culprits:  # nobody is visibly late: the ranks that could not say where they are
        culprits.update(silent)
    return {"reason": reason, "world_size": world_size, "made_at": time.time(),
            "silent": silent, "groups": out_groups, "mismatches": mismatches, "rpc": rpc,
            "culprits": sorted(culprits), "stacks": stacks,
            "notes": {a.rank: a.note for a in answers if a.note},
            "renumbered": {a.rank: a.now for a in answers if a.now >= 0 and a.now != a.rank}}


def _group_key(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (1 << 30, name)


def _group_verdict(name: str, members: list[int], seen: dict[int, dict[int, dict[str, Any]]],
                   silent: dict[int, str]) -> dict[str, Any]:
    """Where each member of group ``name`` is and where they first part ways."""
    known = [r for r in members if r not in silent]
    positions: dict[int, str] = {}
    for rank in members:
        if rank in silent:
            positions[rank] = "unknown (no flight record)"
            continue
        entries = seen.get(rank, {})
        if not entries:
            positions[rank] = "no collective on this group yet"
            continue
        last = entries[max(entries)]
        if last["state"] == "completed":
            positions[rank] = f"done with {_describe(last)}{_site(last)}; not in a collective"
        else:
            positions[rank] = f"in {_describe(last)}, {last['state']}{_site(last)}"
    mismatches, diverge, late, waiting, failed, op = [], None, [], [], [], ""
    all_seqs = sorted({s for r in known for s in seen.get(r, {})})
    for seq in all_seqs:
        here = {r: seen.get(r, {}).get(seq) for r in known}
        present = {r: e for r, e in here.items() if e is not None}
        kinds = {(e["op"], _entry_size(e)) for e in present.values()}
        if len(kinds) > 1:
            mismatches.append({"group": name, "seq": seq,
                               "calls": {r: _describe(e) + _site(e) for r, e in present.items()}})
        # a rank whose ring starts after seq dropped it; only ranks that have nothing at seq
        # while their last record is older than seq did not arrive
        absent = [r for r in here if here[r] is None and max(seen.get(r, {-1: None})) < seq]
        unfinished = [r for r, e in present.items() if e["state"] != "completed"]
        if diverge is None and (absent or len(kinds) > 1 or unfinished):
            diverge = seq
            late = absent
            waiting = [r for r in present if present[r]["state"] in ("queued", "running")]
            failed = [r for r in present if present[r]["state"] == "failed"]
            op = (f"#{seq}: the ranks called different collectives" if len(kinds) > 1
                  else _describe(next(iter(present.values()))))
    return {"ranks": members, "positions": positions, "diverge_seq": diverge,
            "diverge_op": op, "late": late, "waiting": waiting, "failed": failed,
            "mismatches": mismatches}


def format_report(facts: dict[str, Any]) -> str:
    """The report as users read it (docs/hang-report.md shows one). After a shrink or a grow
    back a rank is named by its number in the current world and, where that differs, the one
    it was started as: "rank 1 (was 2)"."""
    renumbered = {int(k): int(v) for k, v in facts.get("renumbered", {}).items()}

    def who(rank: Any) -> str:
        now = renumbered.get(int(rank))
        return str(rank) if now is None else f"{now} (was {rank})"

    def _ranks(ranks: list[int]) -> str:
        return ", ".join(who(r) for r in ranks)

    lines = [f"=== ringtorch hang report: {facts['world_size']} rank(s) ===",
             f"why: {facts['reason']}"]
    silent = {int(k): v for k, v in facts["silent"].items()}
    if silent:
        lines += [f"rank {who(r)}: {why}" for r, why in sorted(silent.items())]
    for name, group in facts["groups"].items():
        gone = ", no longer in use" if group.get("gone") else ""
        lines.append(f"group '{name}' (ranks {_ranks(group['ranks'])}{gone}):")
        for rank, where in sorted(group["positions"].items(), key=lambda kv: int(kv[0])):
            lines.append(f"  rank {who(rank)}: {where}")
        if group["diverge_seq"] is not None:
            text = f"  first divergence: {group['diverge_op']}"
            if group["late"]:
                text += f": ranks [{_ranks(group['late'])}] did not arrive"
            if group["waiting"]:
                text += f"; ranks [{_ranks(group['waiting'])}] are waiting in it"
            if group["failed"]:
                text += f"; ranks [{_ranks(group['failed'])}] failed in it"
            lines.append(text)
        else:
            lines.append("  every rank is in step")
    for bad in facts["mismatches"]:
        calls = "; ".join(f"rank {who(r)} called {c}" for r, c in sorted(
            bad["calls"].items(), key=lambda kv: int(kv[0])))
        lines.append(f"MISMATCH on group '{bad['group']}' at #{bad['seq']}: {calls}")
    for call in facts["rpc"]:
        fn = f" ({call['function']})" if call["function"] else ""
        site = f" at {call['site']}" if call.get("site") else ""
        callee = "" if call.get("to_rank") is None else f" (rank {who(call['to_rank'])})"
        lines.append(f"rank {who(call['rank'])} waits for {call['op']} to {call['to']}{callee}"
                     f"{fn}{site}")
    if facts["culprits"]:
        lines.append(f"everybody waits for: ranks [{_ranks(facts['culprits'])}]")
    notes = {int(k): v for k, v in facts.get("notes", {}).items()}
    shown = facts["culprits"] or sorted(int(r) for r in facts["stacks"])
    for rank in shown:
        threads = facts["stacks"].get(rank) or facts["stacks"].get(str(rank)) or []
        how = f" ({notes[rank]})" if rank in notes and rank not in silent else ""
        lines.append(f"rank {who(rank)} is doing{how}:" if threads else
                     f"rank {who(rank)}: no stacks{how}")
        for thread in threads:
            lines.append(f"  {'main thread' if thread['main'] else 'thread'} "
                         f"{thread['thread']}:")
            lines += [f'    File "{f}", line {n} in {fn}' for f, n, fn in thread["frames"]]
    return "\n".join(lines) + "\n"


__all__ = ["Answer", "Thread", "analyse", "format_report", "is_library", "parse_stacks",
           "useful_frames"]

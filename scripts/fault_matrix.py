"""Run the fault matrix for ringtorch and torch 2.13 and write docs/fault-matrix.md.

    sudo .venv/bin/python scripts/fault_matrix.py                  # everything (~30 min)
    .venv/bin/python scripts/fault_matrix.py --libs ringtorch --layouts 1+1 --no-write
    sudo .venv/bin/python scripts/fault_matrix.py --update --libs ringtorch --faults sigstop

Every cell (workload x fault x ranks per host) runs the same program
(ringtorch/testing/fault_workload.py) under each library, across two hosts made of network
namespaces (needs root and iproute2), through ``ringtorch.testing.fault_matrix.run_cell``.
Both libraries get the same timeouts; ringtorch's knobs keep their defaults except the stall
warning, brought within the timeout so that it shows. The page is rewritten whole, or with
``--update`` only the selected cells' rows for the selected libraries (the other cells and
libraries keep what was measured before, the summary is redone from the page's tables and a
line says what was re-measured when); each cell's raw record goes to ``--raw`` (a scratch
folder, not for committing).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ringtorch.testing.fault_matrix import FAULTS, Cell, CellResult, RankOutcome, Settings, run_cell
from ringtorch.testing.fault_workload import WORKLOADS

ROOT = Path(__file__).resolve().parent.parent
LIBS = ("ringtorch", "torch")
LIB_TITLES = {"ringtorch": "ringtorch", "torch": "torch 2.13 (gloo, TensorPipe)"}
FAULT_TITLES = {"partition": "partition (link cut silently)", "sigkill": "SIGKILL of the last rank",
                "sigstop": "SIGSTOP of the last rank", "store_death": "store host killed (rank 0)"}
STALL_WARNING_S = 5.0


def _short_type(o: RankOutcome) -> str:
    name = o.error_type.rsplit(".", 1)[-1]
    return f"{name} (DistError)" if o.dist_error else name


def _cell_text(o: RankOutcome, r: CellResult, cap_s: float) -> str:
    if o.killed:
        return "killed"
    if o.error_s is None:
        return f"**hang** (> {cap_s:.0f} s)"
    text = f"{o.error_s:.2f} s"
    stalls = [t for t, line in o.warnings if "has waited" in line]
    if stalls:
        text += f" (stall warning at {stalls[0]:.1f} s)"
    if r.cell.fault == "sigstop" and o.rank == r.cell.victim:
        text += " after SIGCONT"
    if o.exit_s is None:
        text += f", still running {r.settings.exit_grace_s:.0f} s later"
    return text


def _escape(text: str, limit: int = 280) -> str:
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return text.replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


def times(r: CellResult) -> str:
    """Every rank's time from the fault to its error, host by host."""
    parts = []
    for host in (0, 1):
        ranks = [f"r{o.rank}: {_cell_text(o, r, r.settings.cap_s)}"
                 for o in r.outcomes if o.host == host]
        parts.append(f"host {host}: " + "; ".join(ranks))
    return "<br>".join(parts)


def messages(r: CellResult) -> str:
    """Each distinct first line the ranks raised, with the ranks that raised it."""
    said: dict[str, list[int]] = {}
    for o in r.outcomes:
        if o.error_s is not None:
            said.setdefault(f"`{_short_type(o)}`: {_escape(o.first_line)}", []).append(o.rank)
    if not said:
        return "nothing"
    return "<br>".join(f"r{','.join(map(str, ranks))}: {line}" for line, ranks in said.items())


def leftovers(r: CellResult) -> str:
    items = [f"{len(v)} {what}" for what, v in (("processes", r.left_processes),
                                                ("/dev/shm files", r.left_shm),
                                                ("listening ports", r.left_ports)) if v]
    late = [o.rank for o in r.outcomes if o.error_s is not None and o.exit_s is None]
    if late:
        items.append(f"ranks {late} did not exit")
    return ", ".join(items) if items else "nothing"


def worst(r: CellResult) -> str:
    """The slowest rank's time to its error, or that some rank hung."""
    reporting = [o for o in r.outcomes if not o.killed
                 and not (r.cell.fault == "sigstop" and o.rank == r.cell.victim)]
    if any(o.error_s is None for o in reporting):
        return f"hang (> {r.settings.cap_s:.0f} s)"
    marks = [mark for mark, ok in (
        ("¹", all(o.dist_error for o in reporting)),
        ("²", all(set(o.named_ranks) & r.cell.culprits(o.rank) for o in reporting))) if not ok]
    return f"{max(o.error_s or 0.0 for o in reporting):.2f} s{' ' if marks else ''}{''.join(marks)}"


def summary(results: list[CellResult], libs: list[str]) -> list[str]:
    """One bullet per library: the cells where every rank ended with a DistError naming the
    culprit, and each fault's slowest rank."""
    return summary_of([(r.lib, r.cell.fault, worst(r), leftovers(r)) for r in results], libs)


def summary_of(rows: list[tuple[str, str, str, str]], libs: list[str]) -> list[str]:
    """``summary`` from each cell's (library, fault, worst(), leftovers()) texts, so that a
    page updated in part (``--update``) can be summed up from its own tables."""
    lines = []
    for lib in libs:
        mine = [row for row in rows if row[0] == lib]
        named = sum(1 for row in mine if row[2][-1] == "s")
        slowest = []
        for fault in dict.fromkeys(row[1] for row in mine):
            of_fault = [row[2] for row in mine if row[1] == fault]
            hangs = [w for w in of_fault if w.startswith("hang")]
            top = hangs[0] if hangs else max(of_fault, key=lambda w: float(w.split()[0]))
            slowest.append(f"{FAULT_TITLES[fault].split(' (')[0]} {top.split(' ')[0]} s"
                           if not hangs else f"{FAULT_TITLES[fault].split(' (')[0]} {top}")
        left = sum(1 for row in mine if row[3] != "nothing")
        lines.append(f"* **{LIB_TITLES[lib]}**: in {named} of {len(mine)} cells every rank (the "
                     f"frozen one aside) ends with a `DistError` naming the culprit; slowest "
                     f"rank per fault: "
                     f"{'; '.join(slowest)}; cells that left something behind: {left}.")
    return lines


def render(results: list[CellResult], settings: Settings, libs: list[str], command: str) -> str:
    by_key = {(r.lib, r.cell): r for r in results}
    cells = list(dict.fromkeys(r.cell for r in results))
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    lines = [
        "# The fault matrix: ringtorch and torch under the same faults",
        "",
        "<!-- written by scripts/fault_matrix.py; rerun it rather than editing by hand -->",
        "",
        "The same program (`ringtorch/testing/fault_workload.py`) runs each workload under",
        "ringtorch and under torch (`import torch.distributed as dist`: gloo for collectives,",
        "TensorPipe for RPC) across two hosts made of two network namespaces joined through a",
        "third one acting as a switch (`ringtorch.testing.netns`), the TCPStore on host 0 with",
        "rank 0. Once every rank has run a few checked steps, one fault strikes:",
        "",
        "* **partition**: the switch drops every frame between the hosts, silently (a",
        "  zero-length queue on its ports); nothing tells either side;",
        "* **SIGKILL** or **SIGSTOP** of the last rank (on host 1); a stopped rank is resumed",
        "  with SIGCONT once the others have ended, and timed from then;",
        "* **store host killed**: SIGKILL of rank 0, whose process hosts the TCPStore server.",
        "",
        "Every rank records the exception it ends with (`(DistError)` marks a subclass of the",
        "library's `DistError`, which `except dist.DistError` catches), the first line of its",
        "message and the time from the fault to the moment it caught it. Then the job's",
        "leftovers are counted: its processes (by a mark in their environment), its files in",
        "/dev/shm and listening ports in either namespace. A rank that raised nothing "
        f"{settings.cap_s:.0f} s",
        "after the fault hangs (and is killed).",
        "",
        f"Settings, the same for both libraries: `init_process_group(timeout={settings.timeout_s:.0f} s)`,",
        f"`rpc_timeout={settings.timeout_s:.0f} s`. ringtorch's knobs keep their defaults",
        "(`RINGTORCH_TCP_USER_TIMEOUT_MS` 10000: a partition is noticed within 15 s) except",
        f"`RINGTORCH_STALL_WARNING_S={STALL_WARNING_S:.0f}`, so that the stall warning shows",
        "before the timeout. The ranks are paced (a step every few milliseconds), so a fault",
        "finds them inside a collective or between two.",
        "",
        f"Measured {datetime.date.today().isoformat()} at commit `{commit}`, "
        f"{os.cpu_count()} cores. To measure again",
        "(root; about half an hour; `--help` lists the options that select cells):",
        "",
        "```",
        command,
        "```",
        "",
        "The suite checks ringtorch's targets on a subset of these cells with short timeouts",
        "(`tests/integration/test_fault_matrix.py`, marked `netns`).",
        "",
        "## In short",
        "",
        *summary(results, libs),
        "",
        "## At a glance: the slowest rank's time to its error",
        "",
        "¹: some rank's error is not a `DistError`. ²: some rank's first line names no culprit",
        "rank (the struck rank; for a partition, a rank on the other host). The frozen rank",
        "itself is left out here (it is timed from its SIGCONT in the tables below).",
        "",
        "| fault | ranks (host 0 + host 1) | workload | " + " | ".join(LIB_TITLES[x] for x in libs) + " |",
        "|---|---|---|" + "---|" * len(libs),
    ]
    for cell in cells:
        row = [FAULT_TITLES[cell.fault], f"{cell.layout[0]} + {cell.layout[1]}", cell.workload]
        row += [worst(by_key[lib, cell]) if (lib, cell) in by_key else "not run" for lib in libs]
        lines.append("| " + " | ".join(row) + " |")
    for workload in dict.fromkeys(c.workload for c in cells):
        lines += ["", f"## {workload}: every rank", "",
                  "| fault | ranks | library | time to error, each rank | what the ranks say "
                  "(first line) | left behind |",
                  "|---|---|---|---|---|---|"]
        for cell in (c for c in cells if c.workload == workload):
            for lib in libs:
                r = by_key.get((lib, cell))
                if r is None:
                    continue
                lines.append(f"| {FAULT_TITLES[cell.fault]} | {cell.layout[0]} + {cell.layout[1]} "
                             f"| {LIB_TITLES[lib]} | {times(r)} | {messages(r)} | {leftovers(r)} |")
    return "\n".join(lines) + "\n"


def _columns(line: str) -> list[str]:
    """The cells of a table row (escaped bars inside cells stay: they read ``\\|``)."""
    return [c.strip() for c in line.strip()[1:-1].split(" | ")]


def update(page: str, results: list[CellResult], command: str) -> str:
    """``page`` (an earlier render) with the rows of ``results``' cells re-measured for their
    libraries, every other cell as it was, the summary redone from the page's tables and a
    line saying what was re-measured when."""
    lines = page.splitlines()
    titles = {v: k for k, v in LIB_TITLES.items()}
    faults = {v: k for k, v in FAULT_TITLES.items()}
    by_key = {(r.lib, r.cell): r for r in results}
    glance = next(i for i, line in enumerate(lines) if line.startswith("## At a glance"))
    header = next(i for i in range(glance, len(lines)) if lines[i].startswith("| fault |"))
    libs = [titles[t] for t in _columns(lines[header])[3:]]
    rows: list[tuple[str, str, str, str]] = []
    left: dict[tuple[str, str, str, str], str] = {}
    for i, line in enumerate(lines):
        cols = _columns(line) if line.startswith("| ") and "+" in line else []
        if len(cols) < 4 or cols[0] not in faults:
            continue
        fault, (a, b) = faults[cols[0]], (int(n) for n in cols[1].split(" + "))
        if i > header and len(cols) == 3 + len(libs) and cols[2] in WORKLOADS:  # at a glance
            for k, lib in enumerate(libs):
                r = by_key.get((lib, Cell(cols[2], fault, (a, b))))
                if r is not None:
                    cols[3 + k] = worst(r)
            lines[i] = "| " + " | ".join(cols) + " |"
            continue
        if cols[2] in titles:  # a workload table: its heading names the workload
            workload = next(lines[j] for j in range(i, 0, -1) if lines[j].startswith("## "))
            workload = workload[3:].split(":")[0]
            r = by_key.get((titles[cols[2]], Cell(workload, fault, (a, b))))
            if r is not None:
                lines[i] = (f"| {cols[0]} | {cols[1]} | {cols[2]} | {times(r)} | {messages(r)} "
                            f"| {leftovers(r)} |")
                cols = _columns(lines[i])
            left[(titles[cols[2]], fault, cols[1], workload)] = cols[-1]
    for line in lines[header + 2:]:
        cols = _columns(line) if line.startswith("| ") else []
        if len(cols) != 3 + len(libs):
            break
        for k, lib in enumerate(libs):
            if cols[3 + k] != "not run":
                rows.append((lib, faults[cols[0]], cols[3 + k],
                             left.get((lib, faults[cols[0]], cols[1], cols[2]), "nothing")))
    short = next(i for i, line in enumerate(lines) if line == "## In short")
    end = next(i for i in range(short + 1, len(lines)) if lines[i].startswith("## "))
    lines[short:end] = ["## In short", "", *summary_of(rows, libs), ""]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    cells = sorted({f"{r.cell.fault} {r.cell.layout[0]}+{r.cell.layout[1]} {r.cell.workload}"
                    for r in results})
    what = (f"Re-measured {datetime.date.today().isoformat()} at commit `{commit}` "
            f"(`{command}`): {', '.join(sorted({r.lib for r in results}))} in the cells "
            f"{'; '.join(cells)}.")
    tail = what.split("): ", 1)[1]
    for i in range(len(lines) - 1, -1, -1):  # the same cells measured again: their old line goes
        if lines[i].startswith("Re-measured ") and lines[i].endswith("): " + tail):
            del lines[i:i + 2]
    at = next(i for i, line in enumerate(lines) if line.startswith("The suite checks"))
    lines[at:at] = [what, ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--libs", default=",".join(LIBS))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--layouts", default="1+1,2+1,2+2",
                        help="ranks on host 0 + host 1, comma-separated (worlds 2 to 4)")
    parser.add_argument("--timeout", type=float, default=20.0,
                        help="the group and RPC timeout of both libraries (s)")
    parser.add_argument("--cap", type=float, default=60.0,
                        help="a rank with no error this long after the fault hangs (s)")
    parser.add_argument("--raw", default="/tmp/fault-matrix-raw",
                        help="where each cell's JSON record and the ranks' stderr go")
    parser.add_argument("--out", default=str(ROOT / "docs" / "fault-matrix.md"))
    parser.add_argument("--reuse", default="",
                        help="libraries whose cells are read from --raw (an earlier run of "
                             "the same cells) instead of being measured again")
    parser.add_argument("--update", action="store_true",
                        help="replace only the selected cells' rows (for the selected "
                             "libraries) in the existing page, keeping the others as measured")
    parser.add_argument("--no-write", action="store_true", help="print the page instead")
    args = parser.parse_args()
    libs = args.libs.split(",")
    settings = Settings(timeout_s=args.timeout, cap_s=args.cap,
                        env=(("RINGTORCH_STALL_WARNING_S", str(STALL_WARNING_S)),))
    layouts = [tuple(int(n) for n in text.split("+")) for text in args.layouts.split(",")]
    cells = [Cell(w, f, (a, b)) for f in args.faults.split(",")
             for (a, b) in layouts for w in args.workloads.split(",")]
    raw = Path(args.raw)
    raw.mkdir(parents=True, exist_ok=True)
    results, started = [], time.monotonic()
    for cell in cells:
        for lib in libs:
            t0, saved = time.monotonic(), raw / f"{lib}-{cell.name}.json"
            if lib in args.reuse.split(","):
                result = CellResult.from_json(json.loads(saved.read_text()))
            else:
                result = run_cell(cell, lib, settings, keep_dir=raw)
                saved.write_text(json.dumps(result.to_json(), indent=1))
            results.append(result)
            print(f"{cell.name:28} {lib:9} {worst(result):>14}  left: {leftovers(result)}  "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
    print(f"measured in {(time.monotonic() - started) / 60:.0f} min", flush=True)
    if args.update:
        command = "sudo .venv/bin/python scripts/fault_matrix.py --update " + " ".join(
            f"--{name} {getattr(args, name)}" for name in ("libs", "faults")
            if getattr(args, name) != parser.get_default(name))
        page = update(Path(args.out).read_text(), results, command.strip())
    else:
        page = render(results, settings, libs, "sudo .venv/bin/python scripts/fault_matrix.py")
    if args.no_write:
        print(page)
    else:
        Path(args.out).write_text(page)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""BENCHMARKS.md's summary table: each area's headline ratio against its anchor, every target.

One table opens the page, read in a minute: per area, what ringtorch is measured against, the
ratio that says most (the page's convention: above 1, ringtorch is faster), then one row per
target with the measured value and PASS or FAIL, and the date and commit of the run. Rows are
worked out from the same JSON as the area's table (bench/_report.py's format), so a run that
rewrites a table rewrites its summary rows; an area without a result keeps its rows, and rows
of areas bench/all.py does not run (hand-measured ones) stay as they were, after the others.
The targets are those of DESIGN.md and of the page's sections.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from _page import ratio, table, us
from _sizes import busbw_factor, human

HEAD = ["area", "anchor", "ringtorch against the anchor", "target", "measured", "result",
        "taken"]
_K, _M = 1024, 1024 * 1024
Target = tuple[str, str, bool]  # (target, measured, passed)


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "**FAIL**"


def _cells(r: dict[str, Any]) -> dict[tuple[str, int, int, str], float]:
    return {(c["op"], c["world"], c["bytes"], c["lib"]): c["seconds"] for c in r["cells"]
            if c["seconds"]}


def _collectives(r: dict[str, Any]) -> tuple[str, list[Target]]:
    t = _cells(r)

    def x(anchor: str, world: int, n: int) -> str:
        a, m = t.get(("all_reduce", world, n, anchor)), t.get(("all_reduce", world, n, "shm"))
        return ratio(a / m) if a and m else "—"

    headline = "world 2: " + "; ".join(
        f"{name} {x('gloo', 2, n)} gloo" + (f", {x('mpi', 2, n)} Open MPI"
                                            if ("all_reduce", 2, n, "mpi") in t else "")
        for name, n in (("1 KB", _K), ("16 MB", 16 * _M)) if ("all_reduce", 2, n, "shm") in t)
    targets: list[Target] = []
    shm1, gloo1 = t.get(("all_reduce", 2, _K, "shm")), t.get(("all_reduce", 2, _K, "gloo"))
    if shm1:
        targets += [("world 2, 1 KB: ≤ 5 µs", f"{us(shm1 * 1e6)} µs", shm1 <= 5e-6),
                    ("world 2, 1 KB: ≤ 20 µs", f"{us(shm1 * 1e6)} µs", shm1 <= 20e-6)]
        if gloo1:
            targets.append(("world 2, 1 KB: ≥ 20x gloo", ratio(gloo1 / shm1),
                            gloo1 / shm1 >= 20))
    sizes = sorted({k[2] for k in t if k[1] == 2 and k[2] >= 64 * _K and k[3] == "mpi"})
    slower = [f"{human(n)} ({x('mpi', 2, n)})" for n in sizes
              if t.get(("all_reduce", 2, n, "shm"), 1e9) > t[("all_reduce", 2, n, "mpi")]]
    if sizes:
        targets.append(("world 2, 64 KB and up: ≥ Open MPI's speed",
                        "slower at " + ", ".join(slower) if slower else "slower at none",
                        not slower))
    for n in (16 * _M, 64 * _M):
        shm, gloo = t.get(("all_reduce", 2, n, "shm")), t.get(("all_reduce", 2, n, "gloo"))
        if shm:
            bw = n * busbw_factor("all_reduce", 2) / shm / 1e9
            targets.append((f"world 2, {human(n)}: busbw ≥ 5 GB/s", f"{bw:.2f} GB/s", bw >= 5))
            if gloo:
                targets.append((f"world 2, {human(n)}: ≥ 4x gloo", ratio(gloo / shm),
                                gloo / shm >= 4))
    for world in sorted({k[1] for k in t if k[1] > 2}):
        shm = t.get(("all_reduce", world, _K, "shm"))
        if shm:
            targets.append((f"world {world}, 1 KB: ≤ 100 µs", f"{us(shm * 1e6)} µs",
                            shm <= 100e-6))
        worse = [human(k[2]) for k in sorted(t) if k[1] == world and k[3] == "gloo"
                 and t.get((k[0], world, k[2], "shm"), 1e9) > t[k]]
        targets.append((f"world {world}: ≥ gloo's speed at every size",
                        "slower at " + (", ".join(worse) or "none"), not worse))
    return headline, targets


def _shm(r: dict[str, Any]) -> tuple[str, list[Target]]:
    t = _cells(r)
    ops = [op for op in r["ops"] if any(k[0] == op for k in t)]

    def at(n: int) -> str:
        return ", ".join(f"{op} {ratio(t[(op, 2, n, 'gloo')] / t[(op, 2, n, 'shm')])}"
                         for op in ops if (op, 2, n, "gloo") in t and (op, 2, n, "shm") in t)

    headline = f"gloo / shm at 1 KB: {at(_K)}; at 16 MB: {at(16 * _M)}"
    slower = sorted({f"{op} {human(n)}" for (op, w, n, lib), s in t.items()
                     if lib in ("gloo", "sockets") and t.get((op, w, n, "shm"), 1e9) > s})
    return headline, [("every size: ≥ gloo's and the socket path's speed",
                       "slower at " + (", ".join(slower) or "none"), not slower)]


def _hierarchy(r: dict[str, Any]) -> tuple[str, list[Target]]:
    t = {(c["op"], c["bytes"], c["mode"]): c["seconds"] for c in r["cells"]}
    sped = [t[(op, n, "sockets")] / t[(op, n, "hier")] for op, n, mode in t
            if mode == "hier" and (op, n, "sockets") in t]
    ar = [f"{human(n)} {ratio(t[('all_reduce', n, 'sockets')] / t[('all_reduce', n, 'hier')])}"
          for n in (_K, 16 * _M) if ("all_reduce", n, "hier") in t
          and ("all_reduce", n, "sockets") in t]
    headline = f"sockets / hier {ratio(min(sped))} to {ratio(max(sped))}" + (
        f"; all_reduce {', '.join(ar)}" if ar else "")
    return headline, []


def _store(r: dict[str, Any]) -> tuple[str, list[Target]]:
    by: dict[int, dict[str, float]] = {}
    for row in r["rows"]:
        by.setdefault(row.get("clients", r["clients"]), {})[row["op"]] = (
            row["ringtorch_ops_s"] / row["torch_ops_s"])
    parts, targets = [], []
    for n, ops in by.items():
        parts.append(f"{n} clients: " + ", ".join(f"{op} {ratio(x)}" for op, x in ops.items()))
        worst = min(ops, key=ops.__getitem__)
        targets.append((f"{n} clients, every op: ≥ 1x torch's ops/s",
                        f"lowest {ratio(ops[worst])} ({worst})", ops[worst] >= 1))
    return "; ".join(parts) + " (ops/s)", targets


def _rendezvous(r: dict[str, Any]) -> tuple[str, list[Target]]:
    by: dict[int, dict[str, float]] = {}
    for row in r["rows"]:
        by.setdefault(row["ranks"], {})[row["store"]] = row["last_s"]
    x = {n: t["torch"] / t["ringtorch"] for n, t in by.items() if len(t) == 2}
    headline = ", ".join(f"{n:,} ranks {ratio(v)}" for n, v in x.items()) + (
        " (torch's time / ringtorch's, last rank through)") if x else "—"
    mine = by.get(4096, {}).get("ringtorch")
    if 4096 in x:
        measured, passed = ratio(x[4096]), x[4096] >= 1
    else:  # not measured side by side: the target is not shown to hold
        measured = "not measured" if mine is None else (
            f"ringtorch {mine:,.0f} s; torch's not measured")
        passed = False
    return headline, [("4,096 ranks: ≤ torch's time", measured, passed)]


def _ddp(r: dict[str, Any]) -> tuple[str, list[Target]]:
    mine = next(row for row in r["rows"] if row["impl"] == "ringtorch")
    return f"throughput {ratio(r['ratio'])}", [
        ("throughput: ≥ 1.3x torch's", ratio(r["ratio"]), r["ratio"] >= 1.3),
        ("weak-scaling efficiency: ≥ 0.9", f"{mine['efficiency']:.2f}",
         mine["efficiency"] >= 0.9)]


def _rpc(r: dict[str, Any]) -> tuple[str, list[Target]]:
    by: dict[str, dict[str, float]] = {}
    for row in r["rows"]:
        by.setdefault(row["size"], {})[row["system"]] = row["median_us"]
    x = {size: s["torch"] / s["ringtorch"] for size, s in by.items()}
    headline = ", ".join(f"{size} {ratio(v)}" for size, v in x.items()) + " (median latency)"
    targets: list[Target] = []
    if "tiny" in x:
        targets.append(("tiny call: ≥ 4x", ratio(x["tiny"]), x["tiny"] >= 4))
    large = [v for size, v in x.items() if size != "tiny"]
    if large:
        targets.append(("4 MB and up: ≥ 1x", f"lowest {ratio(min(large))}", min(large) >= 1))
    return headline, targets


def _autograd(r: dict[str, Any]) -> tuple[str, list[Target]]:
    x = r["ringtorch_steps_s"] / r["torch_steps_s"]
    return f"{ratio(x)} steps/s", [("≥ 1.0x steps/s", ratio(x), x >= 1.0)]


def _mpi(r: dict[str, Any]) -> tuple[str, list[Target]]:
    raw = {(c["op"], c["bytes"]): c["us"] for c in r["cells"] if c["variant"] == "raw"}
    cost = {k: c["us"] / raw[k] for c in r["cells"] if c["variant"] == "backend"
            and (k := (c["op"], c["bytes"])) in raw}
    small = [v for (_, n), v in cost.items() if n == _K]
    large = [v for (_, n), v in cost.items() if n >= _M]
    headline = "backend / raw (the cost)" + (
        f": 1 KB {min(small):.2f}-{max(small):.2f}" if small else "") + (
        f", 1 MB and up {min(large):.2f}-{max(large):.2f}" if large else "")
    targets = [("backend / raw, 1 MB and up: ≤ 1.20", f"highest {max(large):.2f}",
                max(large) <= 1.20)] if large else []
    return headline, targets


def _recorder(r: dict[str, Any]) -> tuple[str, list[Target]]:
    rows = {row["transport"]: row["default_us"] / row["off_us"] for row in r["rows"]}
    headline = "on / off, 1 KB all_reduce: " + ", ".join(
        f"{name} {x:.3f}" for name, x in rows.items())
    targets = [(f"on / off, {name}: ≤ 1.05", f"{x:.3f}", x <= 1.05) for name, x in rows.items()]
    rec = r["per_record"]
    per = rec["on_ns"] - rec["off_ns"]
    targets.append(("CPU per record (world 1): ≤ 0.5 µs", f"{per:,.0f} ns", per <= 500))
    return headline, targets


def _fsdp(r: dict[str, Any]) -> tuple[str, list[Target]]:
    headline = "; ".join(f"world {row['world']}: {ratio(1 / row['vs_gloo'])} gloo's FSDP2"
                         for row in r["rows"])
    targets: list[Target] = []
    for row in r["rows"]:
        w = row["world"]
        targets += [(f"world {w}: step ≤ 0.5x gloo's", f"{row['vs_gloo']:.2f}x",
                     row["vs_gloo"] <= 0.5),
                    (f"world {w}: step ≤ 1.3x ringtorch's DDP step", f"{row['vs_ddp']:.2f}x",
                     row["vs_ddp"] <= 1.3)]
    return headline, targets


def _dtensor(r: dict[str, Any]) -> tuple[str, list[Target]]:
    x = r["ratio"]
    return f"{human(r['bytes'])} at world {r['world']}: {ratio(x)}", [
        (f"{human(r['bytes'])}, world {r['world']}: ≥ 3x gloo", ratio(x), x >= 3)]


# area: (its label in the table, anchor, rows from its results); the table's order
AREAS: dict[str, tuple[str, str, Callable[[dict[str, Any]], tuple[str, list[Target]]]]] = {
    "collectives": ("all_reduce", "gloo, Open MPI", _collectives),
    "shm": ("broadcast, all_gather, reduce_scatter", "gloo, Open MPI", _shm),
    "hierarchy": ("collectives across 2 hosts", "the socket path", _hierarchy),
    "store": ("TCPStore", "torch's TCPStore", _store),
    "rendezvous": ("rendezvous simulation", "torch's TCPStore", _rendezvous),
    "ddp": ("DDP", "torch's DDP (gloo)", _ddp),
    "rpc": ("RPC", "torch RPC (TensorPipe)", _rpc),
    "autograd": ("distributed autograd", "torch's", _autograd),
    "mpi": ("MPI backend", "raw mpi4py", _mpi),
    "recorder": ("flight recorder", "recorder off", _recorder),
    "fsdp": ("FSDP2 step (backend door)", "torch's FSDP2 on gloo; ringtorch's DDP", _fsdp),
    "dtensor": ("DTensor Shard(0) → Replicate", "gloo", _dtensor),
}


def area_rows(area: str, env: dict[str, Any]) -> list[list[str]]:
    """One area's rows: the first with its anchor, headline and date, then a row per target."""
    label, anchor, rows_of = AREAS[area]
    headline, targets = rows_of(env["results"])
    taken = (env.get("date") or "")[:10] + (f", {env['commit']}" if env.get("commit") else "")
    targets = targets or [("—", "—", True)]
    rows = []
    for i, (target, measured, passed) in enumerate(targets):
        result = "—" if target == "—" else _verdict(passed)
        rows.append([label, anchor if i == 0 else "", headline if i == 0 else "", target,
                     measured, result, taken if i == 0 else ""])
    return rows


def _existing(block: str) -> list[list[str]]:
    lines = [line for line in block.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in lines[1:]]  # the first is the head


def render(old_block: str, envs: dict[str, dict[str, Any]]) -> str:
    """The summary block: the rows of the areas in ``envs`` worked out anew, the other rows of
    ``old_block`` (the current one) kept; then the count of targets missed, naming them."""
    old = _existing(old_block)
    labels = {label: area for area, (label, _, _) in AREAS.items()}
    rows = []
    for area, (label, _, _) in AREAS.items():
        rows += area_rows(area, envs[area]) if area in envs else [r for r in old if r[0] == label]
    rows += [r for r in old if r[0] not in labels]  # areas bench/all.py does not run
    failed = [f"{r[0]}: {r[3]}" for r in rows if r[5] == "**FAIL**"]
    checked = [r for r in rows if r[5] in ("PASS", "**FAIL**")]
    text = table(HEAD, rows)
    if failed:
        text += (f"\n\n**{len(failed)} of {len(checked)} targets are missed:** "
                 + "; ".join(failed) + ".")
    else:
        text += f"\n\nEvery one of the {len(checked)} targets is met."
    return text

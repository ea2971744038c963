"""BENCHMARKS.md's tables, written from the benchmarks' JSON (bench/_report.py's format).

Each area of the page has a generated block between two markers,

    <!-- bench/all.py: begin store -->
    ...
    <!-- bench/all.py: end store -->

and ``splice`` replaces what is between them, leaving every hand-written line of the page as
it was; an area without a result keeps its block. A block says when, where (commit, CPU,
cores) and under which load its numbers were taken, the command that regenerates it, and the
table with each ratio to its anchor. Ratios are written anchor / ringtorch for times (above
1: ringtorch is faster) and ringtorch / anchor for rates (ops/s, samples/s, steps/s: above 1:
ringtorch does more), except the MPI overhead, which is backend / raw mpi4py (the cost).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from _sizes import busbw_factor, human

LIB_NAMES = {"shm": "shm", "sockets": "sockets", "gloo": "gloo", "mpi": "Open MPI",
             "ringtorch-mpi": "MPI backend", "ringtorch-dist": "facade"}
RINGTORCH_LIBS = ("shm", "sockets")  # the libraries compared against the anchors
ANCHOR_LIBS = ("gloo", "mpi")


def marker(area: str, end: bool = False) -> str:
    return f"<!-- bench/all.py: {'end' if end else 'begin'} {area} -->"


def splice(page: str, blocks: dict[str, str]) -> str:
    """``page`` with each area's block replaced by ``blocks[area]``; the markers stay."""
    for area, block in blocks.items():
        begin, end = marker(area), marker(area, end=True)
        if page.count(begin) != 1 or page.count(end) != 1:
            raise ValueError(f"the page needs exactly one '{begin}' and one '{end}' line")
        start = page.index(begin) + len(begin)
        stop = page.index(end)
        if stop < start:
            raise ValueError(f"'{end}' comes before '{begin}'")
        page = page[:start] + "\n" + block.strip() + "\n" + page[stop:]
    return page


def block_text(page: str, area: str) -> str:
    """What is between ``area``'s markers in ``page`` ("" when it has none)."""
    begin, end = marker(area), marker(area, end=True)
    if begin not in page or end not in page:
        return ""
    return page[page.index(begin) + len(begin):page.index(end)]


def splice_pages(pages: dict[Any, str], blocks: dict[str, str]) -> dict[Any, str]:
    """Each of ``pages`` (path: text) with the blocks whose markers it holds replaced; a block
    goes to the one page that has its begin marker (else the first page, which refuses it)."""
    out = dict(pages)
    for area, text in blocks.items():
        holders = [p for p, page in out.items() if marker(area) in page]
        where = holders[0] if len(holders) == 1 else next(iter(out))
        out[where] = splice(out[where], {area: text})
    return out


# -- formatting --------------------------------------------------------------------------------


def us(micros: float | None) -> str:
    if micros is None:
        return "—"
    return f"{micros:,.0f}" if round(micros, 1) >= 100 else f"{micros:.1f}"


def ratio(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.0f}x" if x >= 100 else f"{x:.1f}x" if x >= 10 else f"{x:.2f}x"


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _load(env: dict[str, Any]) -> str:
    load = env.get("load") or {}
    if "text" in load:
        return str(load["text"])
    before, after = load.get("before"), load.get("after")
    if not before or not after:
        return "not recorded"
    return f"{before[0]:.2f} before, {after[0]:.2f} after"


def provenance(env: dict[str, Any], regenerate: str) -> str:
    """The line above a table: when, where, under which load, and how to regenerate it."""
    machine = env.get("machine") or {}
    cpu = machine.get("cpu") or "CPU model not recorded"
    when = (env.get("date") or "date not recorded").replace("T", " ").replace("Z", " UTC")
    where = f"commit {env['commit']}" if env.get("commit") else "commit not recorded"
    text = (f"*Taken {when}, {where}, on {machine.get('cores', '?')} cores ({cpu}); load "
            f"average (1 min) {_load(env)}.*")
    if env.get("note"):
        text += f" *{env['note']}*"
    commands = env["command"] if isinstance(env["command"], list) else [env["command"]]
    measured = " and ".join(f"`{c}`" for c in commands)
    return f"{text}\n\nMeasured with {measured}; regenerate: `{regenerate}`."


# -- one renderer per area ---------------------------------------------------------------------


def render_store(r: dict[str, Any]) -> str:
    clients = r["clients"]  # one count (older results) or the list of counts, one per row
    rows = [[str(row.get("clients", clients)), row["op"], f"{row['torch_ops_s']:,.0f}",
             f"{row['ringtorch_ops_s']:,.0f}", ratio(row["ringtorch_ops_s"] / row["torch_ops_s"]),
             " + ".join(f"{x:.1f}" for x in row["torch_cpu_us"]),
             " + ".join(f"{x:.1f}" for x in row["ringtorch_cpu_us"])] for row in r["rows"]]
    return table(["clients", "op", "torch ops/s", "ringtorch ops/s", "ringtorch / torch",
                  "CPU µs/op torch (server + client)", "CPU µs/op ringtorch (server + client)"],
                 rows)


def render_rendezvous(r: dict[str, Any]) -> str:
    rows = []
    for row in r["rows"]:
        calls = row["calls_per_rank"]
        rows.append([f"{row['ranks']:,}", row["store"], f"{row['last_s']:.2f}",
                     f"{row['median_s']:.2f}", f"{row['server_cpu_s']:.2f}",
                     f"{row['server_rss_mib']:,.0f} ({row['server_peak_rss_mib']:,.0f})",
                     f"{calls['init']} + {calls['new_group']}",
                     str(row["wire_requests_per_rank"] or "—"), f"{row['connect_s']:.2f}"])
    return table(["ranks", "store", "last rank through (s)", "median rank (s)",
                  "server CPU (s)", "server RSS, MiB (peak)", "calls per rank: init + new_group",
                  "wire requests per rank", "connecting, untimed (s)"], rows) + (
        f"\n\n{r['procs']} driver processes; descriptor limit {r['fd_limit']:,}.")


def _coll_cells(r: dict[str, Any]) -> dict[tuple[str, int, int], dict[str, float]]:
    cells: dict[tuple[str, int, int], dict[str, float]] = {}
    for c in r["cells"]:
        if c["seconds"]:
            cells.setdefault((c["op"], c["world"], c["bytes"]), {})[c["lib"]] = c["seconds"]
    return cells


def render_collectives(r: dict[str, Any]) -> str:
    """A row per (op, world, size): each library's time, busbw of ringtorch's reference
    library and of gloo, and every anchor / ringtorch ratio; then the run's target lines."""
    text = _coll_table(r)
    if r.get("targets"):
        text += "\n\nTargets, checked on this table:\n\n" + "\n".join(
            f"- `{line}`" for line in r["targets"])
    return text


def _coll_table(r: dict[str, Any]) -> str:
    cells = _coll_cells(r)
    libs = [lib for lib in LIB_NAMES if lib in r["libs"]]
    ref = next((lib for lib in RINGTORCH_LIBS if lib in libs), libs[0])
    mine = [lib for lib in RINGTORCH_LIBS if lib in libs]
    pairs = [(a, m) for a in ANCHOR_LIBS if a in libs for m in mine
             if a == "gloo" or m == ref]  # Open MPI only against the reference
    bw_libs = [lib for lib in (ref, "gloo") if lib in libs]
    head = ["op", "world", "size", *[f"{LIB_NAMES[lib]} µs" for lib in libs],
            *[f"{LIB_NAMES[lib]} busbw GB/s" for lib in bw_libs],
            *[f"{LIB_NAMES[a]} / {m}" for a, m in pairs]]
    rows = []
    for (op, world, nbytes), t in sorted(cells.items(),
                                         key=lambda kv: (r["ops"].index(kv[0][0]), kv[0][1:])):
        row = [op, str(world), human(nbytes), *[us(t[lib] * 1e6 if lib in t else None)
                                                for lib in libs]]
        bw = {lib: nbytes / t[lib] * busbw_factor(op, world) / 1e9 for lib in t}
        row += [f"{bw[lib]:.2f}" if lib in bw else "—" for lib in bw_libs]
        row += [ratio(t[a] / t[m]) if a in t and m in t else "—" for a, m in pairs]
        rows.append(row)
    return table(head, rows)


def render_hierarchy(r: dict[str, Any]) -> str:
    modes = r["modes"]
    cells: dict[tuple[str, int | None], dict[str, float]] = {}
    order = []
    for c in r["cells"]:
        key = (c["op"], c["bytes"])
        if key not in cells:
            order.append(key)
        cells.setdefault(key, {})[c["mode"]] = c["seconds"]
    rows = []
    for op, nbytes in order:
        t = cells[(op, nbytes)]
        busbw = "" if nbytes is None else \
            f"{nbytes * busbw_factor(op, r['world']) / t['hier'] / 1e9:.2f}"
        rows.append([op, "-" if nbytes is None else human(nbytes),
                     *[us(t[m] * 1e6 if m in t else None) for m in modes], busbw,
                     ratio(t["sockets"] / t["hier"])])
    return table(["op", "size", *[f"{m} µs" for m in modes], "hier busbw GB/s",
                  "sockets / hier"], rows)


def render_ddp(r: dict[str, Any]) -> str:
    def ms(s: float | None) -> str:
        return "-" if s is None else f"{s * 1e3:.1f} ms"

    names = {"single": "one process", "independent": f"{r['world_size']} processes, no comm",
             "torch": f"torch DDP x{r['world_size']} (gloo)",
             "ringtorch": f"ringtorch DDP x{r['world_size']}"}
    rows = [[names.get(row["impl"], row["impl"]), ms(row["step_p50_s"]),
             f"{row['samples_per_s']:,.1f}", f"{row['efficiency']:.2f}",
             f"{row['vs_independent']:.2f}", ms(row["exposed_comm_s"]),
             ms(row.get("bucket_wait_p50_s")), ms(row["cpu_per_step_s"])] for row in r["rows"]]
    text = table(["configuration", "step p50", "samples/s", "efficiency", "vs no-comm",
                  "exposed comm", "bucket wait", "CPU/step"], rows)
    widths = "-".join(str(w) for w in r["widths"])
    return (f"MLP {widths}, batch {r['batch']} per rank, {r['rounds']} rounds of {r['steps']} "
            f"steps.\n\n{text}\n\n**ringtorch / torch throughput: {ratio(r['ratio'])}**")


def render_rpc(r: dict[str, Any]) -> str:
    def lat(row: dict[str, Any], key: str) -> str:
        v = row[key]
        text = f"{v / 1e3:,.1f} ms" if v >= 10_000 else f"{us(v)} µs"
        if key == "median_us" and row.get("GB/s"):
            text += f" ({row['GB/s']:.2f} GB/s)"
        return text

    by_size: dict[str, dict[str, dict[str, Any]]] = {}
    for row in r["rows"]:
        by_size.setdefault(row["size"], {})[row["system"]] = row
    rows = []
    for size, systems in by_size.items():
        t, m = systems["torch"], systems["ringtorch"]
        rows.append([size, lat(t, "median_us"), lat(t, "p90_us"), lat(m, "median_us"),
                     lat(m, "p90_us"), ratio(t["median_us"] / m["median_us"])])
    return table(["size", "torch median", "torch p90", "ringtorch median", "ringtorch p90",
                  "torch / ringtorch"], rows)


def render_mpi(r: dict[str, Any]) -> str:
    found: dict[tuple[str, int], dict[str, float]] = {}
    order = []
    for c in r["cells"]:
        key = (c["op"], c["bytes"])
        if key not in found:
            order.append(key)
        found.setdefault(key, {})[c["variant"]] = c["us"]
    variants = [v for v in ("raw", "backend", "nocheck", "facade")
                if any(v in found[k] for k in order)]
    rows = []
    for op, nbytes in order:
        t = found[(op, nbytes)]
        rows.append([op, human(nbytes), *[us(t.get(v)) for v in variants],
                     *[f"{t[v] / t['raw']:.2f}" if v in t else "—" for v in variants[1:]]])
    return table(["op", "size", *[f"{v} µs" for v in variants],
                  *[f"{v} / raw" for v in variants[1:]]], rows)


def render_autograd(r: dict[str, Any]) -> str:
    row = [f"seed 004 ({r['steps']} steps, median of {r['rounds']} rounds)",
           f"{r['torch_steps_s']:.1f}", f"{r['ringtorch_steps_s']:.1f}",
           ratio(r["ringtorch_steps_s"] / r["torch_steps_s"])]
    text = table(["program", "torch steps/s", "ringtorch steps/s", "ringtorch / torch"], [row])
    if r.get("same_losses") is False:
        text += "\n\n**The two systems reached different losses in this run.**"
    return text


def render_recorder(r: dict[str, Any]) -> str:
    """The 1 KB all_reduce at world 2 with the recorder off, its ring only and on by default
    (and tracing), then the cost per record in one process; the goals are under 1 µs and
    under 5% per operation."""
    rows = []
    for row in r["rows"]:
        off, on = row["off_us"], row["default_us"]
        if row.get("trace_us") is None:
            trace = ["not available"] * 3
        else:
            trace = [us(row["trace_off_us"]), us(row["trace_us"]),
                     f"{row['trace_us'] / row['trace_off_us']:.3f}"]
        work = (f"{(row['work_us'] - off) * 1e3:,.0f}" if row.get("work_us") is not None
                else "not measured")
        ring = (["not measured"] * 2 if row.get("ring_us") is None
                else [us(row["ring_us"]), f"{row['ring_us'] / off:.3f}"])
        rows.append([row["transport"], us(off), *ring, us(on), f"{on / off:.3f}",
                     f"{(on - off) * 1e3:,.0f}", work, *trace])
    text = table(["transport", "recorder off µs", "ring only µs", "ring / off",
                  "default µs", "default / off", "default's cost per op ns",
                  "1 µs of CPU costs ns", "tracing job: off µs", "tracing on µs",
                  "tracing / off"], rows)
    rec = r["per_record"]
    alone = ""
    if "counting_ns" in rec:
        alone = f"; the summary's totals alone {rec['counting_ns']:,.0f} ns"
    elif "listeners_ns" in rec:  # results from before the totals were counted in batches
        alone = f"; the listeners alone {rec['listeners_ns']:,.0f} ns"
    kept = (" (the ring kept, full, across the switches: the state of a job that has run "
            "for a while)" if r.get("ring_kept") else "")
    return (f"1 KB all_reduce at world 2, recorder switched off and on between blocks of "
            f"{r['iters']} calls{kept}, {r['blocks']} blocks each per job, median over "
            f"{r['repeats']} job(s). Ring only: the flight recorder alone (a job outside ringrun); default: "
            f"the ring and the summary's totals (a job under ringrun). The yardstick column: "
            f"with the recorder off, 1 µs of the caller's own Python work (measured by CPU "
            f"time) before each call; what one microsecond of CPU per operation costs in this "
            f"two-rank job.\n\n{text}\n\n"
            f"Per record (world 1 all_reduce in one process, CPU time of "
            f"the calling thread): off {rec['off_ns']:,.0f} ns, ring only "
            f"+{rec['ring_ns'] - rec['off_ns']:,.0f} ns, ring and the summary's totals "
            f"(the default) +{rec['on_ns'] - rec['off_ns']:,.0f} ns{alone}.")


def render_fsdp(r: dict[str, Any]) -> str:
    """Per world size: each configuration's median step, then the two targets' ratios."""
    names = ["fsdp2 ringtorch", "fsdp2 gloo", "ddp ringtorch", "ddp door", "compute",
             "comm ringtorch", "comm gloo"]
    rows = [[str(row["world"]), *[f"{row[n.replace(' ', '_') + '_s'] * 1e3:.1f}" for n in names],
             f"{row['vs_gloo']:.2f}", f"{row['vs_ddp']:.2f}"] for row in r["rows"]]
    text = table(["world", *[f"{n} ms" for n in names], "fsdp2 ringtorch / gloo",
                  "fsdp2 ringtorch / ddp ringtorch"], rows)
    return (f"{r['layers']} x [Linear({r['width']}, {r['width']}) + ReLU], batch {r['batch']} "
            f"per rank, SGD, per-layer `fully_shard`; median step of the slowest rank over "
            f"{r['rounds']} rounds of {r['steps']} steps, configurations alternating.\n\n{text}")


def render_dtensor(r: dict[str, Any]) -> str:
    row = [str(r["world"]), human(r["bytes"]), us(r["ringtorch_s"] * 1e6),
           us(r["gloo_s"] * 1e6), ratio(r["ratio"])]
    return table(["world", "size", "ringtorch µs", "gloo µs", "gloo / ringtorch"], [row])


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "store": render_store, "collectives": render_collectives, "shm": render_collectives,
    "hierarchy": render_hierarchy, "ddp": render_ddp, "rpc": render_rpc, "mpi": render_mpi,
    "autograd": render_autograd, "recorder": render_recorder, "fsdp": render_fsdp,
    "dtensor": render_dtensor, "rendezvous": render_rendezvous}


def block(area: str, env: dict[str, Any], regenerate: str) -> str:
    """One area's generated block: provenance, then the table."""
    return provenance(env, regenerate) + "\n\n" + RENDERERS[area](env["results"])

"""bench/all.py writes BENCHMARKS.md's tables from the benchmarks' JSON.

The page's hand-written text and every block of an area without a result stay as they were;
a block shows its provenance, and each ratio is the anchor's time over ringtorch's (rates:
ringtorch's over the anchor's), worked out here by hand from the fixed input.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALL = ROOT / "bench" / "all.py"

PAGE = """# Benchmarks

Hand-written introduction.

<!-- bench/all.py: begin summary -->
<!-- bench/all.py: end summary -->

## Store

Prose about the store.

<!-- bench/all.py: begin store -->
old store table
<!-- bench/all.py: end store -->

## Collectives

<!-- bench/all.py: begin collectives -->
old collectives table
<!-- bench/all.py: end collectives -->

## DDP

<!-- bench/all.py: begin ddp -->
old ddp table
<!-- bench/all.py: end ddp -->

Closing words.
"""


def _envelope(bench: str, results: dict) -> dict:
    return {"format": 1, "bench": bench, "command": f"python bench/{bench}.py --x 1",
            "date": "2026-01-02T03:04:05Z", "commit": "abc1234",
            "machine": {"cpu": "Test CPU 9000", "cores": 2},
            "load": {"before": [0.5, 0.4, 0.3], "after": [0.75, 0.5, 0.3]}, "results": results}


STORE = {"clients": [4, 32], "procs": 4, "seconds": 1.0, "rounds": 1, "rows": [
    {"clients": 4, "op": "set", "torch_ops_s": 200_000.0, "ringtorch_ops_s": 100_000.0,
     "torch_cpu_us": [0.4, 1.9], "ringtorch_cpu_us": [1.1, 2.6]},
    {"clients": 4, "op": "get", "torch_ops_s": 20_000.0, "ringtorch_ops_s": 30_000.0,
     "torch_cpu_us": [20.0, 28.0], "ringtorch_cpu_us": [15.0, 21.0]},
    {"clients": 32, "op": "get", "torch_ops_s": 20_000.0, "ringtorch_ops_s": 25_000.0,
     "torch_cpu_us": [20.0, 28.0], "ringtorch_cpu_us": [15.0, 21.0]}]}

_MIB = 1 << 20
COLLECTIVES = {
    "ops": ["all_reduce"], "world_sizes": [2], "sizes": [1024, _MIB],
    "libs": ["shm", "sockets", "gloo", "mpi"], "targets": ["PASS  world 2, 1 KB: at most 20 µs"],
    "cells": [
        {"op": "all_reduce", "world": 2, "bytes": 1024, "lib": "shm", "seconds": 10e-6},
        {"op": "all_reduce", "world": 2, "bytes": 1024, "lib": "sockets", "seconds": 20e-6},
        {"op": "all_reduce", "world": 2, "bytes": 1024, "lib": "gloo", "seconds": 500e-6},
        {"op": "all_reduce", "world": 2, "bytes": 1024, "lib": "mpi", "seconds": 5e-6},
        {"op": "all_reduce", "world": 2, "bytes": _MIB, "lib": "shm", "seconds": 100e-6},
        {"op": "all_reduce", "world": 2, "bytes": _MIB, "lib": "sockets", "seconds": 250e-6},
        {"op": "all_reduce", "world": 2, "bytes": _MIB, "lib": "gloo", "seconds": 1.2e-3},
        {"op": "all_reduce", "world": 2, "bytes": _MIB, "lib": "mpi", "seconds": 150e-6}]}


def _write_results(out: Path, **areas: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for area, (bench, results) in areas.items():
        (out / f"{area}.json").write_text(json.dumps(_envelope(bench, results)))


def _render(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ALL), "--render-only", "--out",
                           str(tmp_path / "out"), "--page", str(tmp_path / "page.md"), *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def _block(page: str, area: str) -> str:
    begin, end = f"<!-- bench/all.py: begin {area} -->", f"<!-- bench/all.py: end {area} -->"
    return page[page.index(begin) + len(begin): page.index(end)]


def test_tables_are_written_between_the_markers_and_the_rest_stays(tmp_path: Path) -> None:
    (tmp_path / "page.md").write_text(PAGE)
    _write_results(tmp_path / "out", store=("store", STORE))
    done = _render(tmp_path, "--only", "store,ddp")  # ddp has no result: its block stays
    assert done.returncode == 1, done.stderr
    assert "no result (their blocks are unchanged): ddp" in done.stderr
    page = (tmp_path / "page.md").read_text()
    untouched = PAGE.replace("old store table\n", "")
    assert page.replace(_block(page, "store"), "\n").replace(_block(page, "summary"), "\n") \
        == untouched
    block = _block(page, "store")
    assert ("*Taken 2026-01-02 03:04:05 UTC, commit abc1234, on 2 cores (Test CPU 9000); "
            "load average (1 min) 0.50 before, 0.75 after.*") in block
    assert ("Measured with `python bench/store.py --x 1`; regenerate: "
            "`python bench/all.py --only store`.") in block
    assert "| 4 | set | 200,000 | 100,000 | 0.50x | 0.4 + 1.9 | 1.1 + 2.6 |" in block
    assert "| 4 | get | 20,000 | 30,000 | 1.50x | 20.0 + 28.0 | 15.0 + 21.0 |" in block
    assert "| 32 | get | 20,000 | 25,000 | 1.25x | 20.0 + 28.0 | 15.0 + 21.0 |" in block
    # the summary: ringtorch / torch ops/s by client count, a target for each (every op at
    # least torch's rate), which names the slowest op
    summary = _block(page, "summary")
    assert ("| TCPStore | torch's TCPStore | 4 clients: set 0.50x, get 1.50x; 32 clients: get "
            "1.25x (ops/s) | 4 clients, every op: ≥ 1x torch's ops/s | lowest 0.50x (set) | "
            "**FAIL** | 2026-01-02, abc1234 |") in summary
    assert ("| TCPStore |  |  | 32 clients, every op: ≥ 1x torch's ops/s | lowest 1.25x (get) "
            "| PASS |  |") in summary
    assert ("**1 of 2 targets are missed:** TCPStore: 4 clients, every op: ≥ 1x torch's "
            "ops/s.") in summary


def test_collective_ratios_are_anchor_time_over_ringtorch_time(tmp_path: Path) -> None:
    (tmp_path / "page.md").write_text(PAGE)
    _write_results(tmp_path / "out", collectives=("collectives", COLLECTIVES))
    # no figure here (it needs matplotlib, which the test extra does not bring)
    done = _render(tmp_path, "--only", "collectives", "--no-plot")
    assert done.returncode == 0, done.stderr
    block = _block((tmp_path / "page.md").read_text(), "collectives")
    assert ("| op | world | size | shm µs | sockets µs | gloo µs | Open MPI µs | "
            "shm busbw GB/s | gloo busbw GB/s | gloo / shm | gloo / sockets | "
            "Open MPI / shm |") in block
    # 1 KB: busbw = 1024 B / 10 µs * 2(2-1)/2 = 0.10 GB/s; gloo 500/10 = 50x, 500/20 = 25x,
    # Open MPI 5/10 = 0.5x (Open MPI faster)
    assert "| all_reduce | 2 | 1K | 10.0 | 20.0 | 500 | 5.0 | 0.10 | 0.00 | 50.0x | 25.0x | " \
        "0.50x |" in block
    # 1 MiB: busbw 1048576 / 100 µs = 10.49 GB/s, gloo 0.87; 1200/100 = 12x, 1200/250 = 4.8x
    assert "| all_reduce | 2 | 1M | 100 | 250 | 1,200 | 150 | 10.49 | 0.87 | 12.0x | 4.80x | " \
        "1.50x |" in block
    assert "- `PASS  world 2, 1 KB: at most 20 µs`" in block
    assert "old ddp table" in (tmp_path / "page.md").read_text()
    # the summary: 1 KB in 10 µs misses 5 µs and meets 20 µs and 20x gloo (50x); from 64 KB
    # up (1 MiB here) shm's 100 µs beats Open MPI's 150 µs; no 16 MB cell: no busbw row
    summary = _block((tmp_path / "page.md").read_text(), "summary").splitlines()
    rows = [line for line in summary if line.startswith("| all_reduce |")]
    assert rows == [
        "| all_reduce | gloo, Open MPI | world 2: 1 KB 50.0x gloo, 0.50x Open MPI | world 2, "
        "1 KB: ≤ 5 µs | 10.0 µs | **FAIL** | 2026-01-02, abc1234 |",
        "| all_reduce |  |  | world 2, 1 KB: ≤ 20 µs | 10.0 µs | PASS |  |",
        "| all_reduce |  |  | world 2, 1 KB: ≥ 20x gloo | 50.0x | PASS |  |",
        "| all_reduce |  |  | world 2, 64 KB and up: ≥ Open MPI's speed | slower at none | PASS "
        "|  |"]


RECORDER = {"repeats": 5, "iters": 1000, "blocks": 7, "tracing": True, "ring_kept": True,
            "rows": [
    {"transport": "shm", "off_us": 10.0, "ring_us": 10.2, "default_us": 10.4, "work_us": 11.5,
     "trace_off_us": 10.0, "trace_us": 12.5},
    {"transport": "sockets", "off_us": 20.0, "default_us": 20.5, "trace_off_us": None,
     "trace_us": None}],
    "per_record": {"off_ns": 9000.0, "ring_ns": 9600.0, "on_ns": 9900.0,
                   "counting_ns": 250.0}}


def test_the_recorders_cost_is_on_over_off(tmp_path: Path) -> None:
    page = PAGE.replace("## DDP", "## Recorder\n\n<!-- bench/all.py: begin recorder -->\nold\n"
                                  "<!-- bench/all.py: end recorder -->\n\n## DDP")
    (tmp_path / "page.md").write_text(page)
    _write_results(tmp_path / "out", recorder=("recorder", RECORDER))
    done = _render(tmp_path, "--only", "recorder")
    assert done.returncode == 0, done.stderr
    block = _block((tmp_path / "page.md").read_text(), "recorder")
    # shm: ring 10.2 / 10.0 = 1.020; default 10.4 / 10.0 = 1.040, (10.4 - 10.0) µs = 400 ns;
    # 1 µs of CPU: 11.5 - 10.0 µs = 1,500 ns; tracing 12.5 / 10.0 = 1.250. Results from before
    # the ring-only column and the yardstick have neither.
    assert "| shm | 10.0 | 10.2 | 1.020 | 10.4 | 1.040 | 400 | 1,500 | 10.0 | 12.5 | 1.250 |" \
        in block
    assert ("| sockets | 20.0 | not measured | not measured | 20.5 | 1.025 | 500 | not measured "
            "| not available | not available | not available |") in block
    assert ("off 9,000 ns, ring only +600 ns, ring and the summary's totals (the default) "
            "+900 ns; the summary's totals alone 250 ns.") in block
    assert ("switched off and on between blocks of 1000 calls (the ring kept, full, across the "
            "switches: the state of a job that has run for a while), 7 blocks") in block
    # the summary: default / off 1.040 and 1.025 meet 1.05; 900 ns per record misses 0.5 µs
    summary = _block((tmp_path / "page.md").read_text(), "summary")
    assert ("| flight recorder | recorder off | on / off, 1 KB all_reduce: shm 1.040, sockets "
            "1.025 | on / off, shm: ≤ 1.05 | 1.040 | PASS | 2026-01-02, abc1234 |") in summary
    assert "| flight recorder |  |  | on / off, sockets: ≤ 1.05 | 1.025 | PASS |  |" in summary
    assert ("| flight recorder |  |  | CPU per record (world 1): ≤ 0.5 µs | 900 ns | **FAIL** "
            "|  |") in summary


def _rdv_row(store: str, ranks: int, last_s: float) -> dict:
    return {"store": store, "ranks": ranks, "procs": 8, "connect_s": 1.5, "last_s": last_s,
            "median_s": last_s - 0.5, "server_cpu_s": 4.25, "server_rss_mib": 100.0,
            "server_peak_rss_mib": 120.0, "calls_per_rank": {"init": 17, "new_group": 13},
            "wire_requests_per_rank": 30 if store == "ringtorch" else None}


def test_the_rendezvous_target_is_torchs_time_at_4096_ranks_and_fails_unmeasured(
        tmp_path: Path) -> None:
    page = PAGE.replace("## DDP", "## Rendezvous\n\n<!-- bench/all.py: begin rendezvous -->\n"
                                  "old\n<!-- bench/all.py: end rendezvous -->\n\n## DDP")
    both = {"procs": 8, "fd_limit": 20000, "rows": [
        _rdv_row("ringtorch", 1024, 30.0), _rdv_row("torch", 1024, 150.0),
        _rdv_row("ringtorch", 4096, 400.0), _rdv_row("torch", 4096, 300.0)]}
    (tmp_path / "page.md").write_text(page)
    _write_results(tmp_path / "out", rendezvous=("rendezvous_sim", both))
    assert _render(tmp_path, "--only", "rendezvous").returncode == 0
    text = (tmp_path / "page.md").read_text()
    assert ("| 1,024 | ringtorch | 30.00 | 29.50 | 4.25 | 100 (120) | 17 + 13 | 30 | 1.50 |"
            in _block(text, "rendezvous"))
    assert "| 4,096 | torch | 300.00 | 299.50 | 4.25 | 100 (120) | 17 + 13 | — | 1.50 |" in \
        _block(text, "rendezvous")
    # torch's time / ringtorch's: 150 / 30 = 5.00 at 1,024; 300 / 400 = 0.75 at 4,096: missed
    assert ("| rendezvous simulation | torch's TCPStore | 1,024 ranks 5.00x, 4,096 ranks 0.75x "
            "(torch's time / ringtorch's, last rank through) | 4,096 ranks: ≤ torch's time | "
            "0.75x | **FAIL** |") in _block(text, "summary")
    # without torch's run at 4,096 the target is not shown to hold
    (tmp_path / "page.md").write_text(page)
    alone = dict(both, rows=both["rows"][:3])
    _write_results(tmp_path / "out", rendezvous=("rendezvous_sim", alone))
    assert _render(tmp_path, "--only", "rendezvous").returncode == 0
    assert ("| 4,096 ranks: ≤ torch's time | ringtorch 400 s; torch's not measured | **FAIL** |"
            in _block((tmp_path / "page.md").read_text(), "summary"))


def test_an_area_without_a_result_keeps_its_summary_rows_and_hand_rows_stay_last(
        tmp_path: Path) -> None:
    head = ("| area | anchor | ringtorch against the anchor | target | measured | result | "
            "taken |\n|---|---|---|---|---|---|---|\n")
    hand = "| ZeRO | torch's | 0.55 of torch's time | — | — | — | 2025-12-31 |"
    ddp = "| DDP | torch's DDP (gloo) | throughput 2.00x | throughput: ≥ 1.3x torch's | 2.00x | " \
          "PASS | 2025-12-30 |"
    old = PAGE.replace("<!-- bench/all.py: begin summary -->\n",
                       f"<!-- bench/all.py: begin summary -->\n{head}{hand}\n{ddp}\n")
    (tmp_path / "page.md").write_text(old)
    _write_results(tmp_path / "out", store=("store", STORE))
    done = _render(tmp_path, "--only", "store")
    assert done.returncode == 0, done.stderr
    rows = [line for line in _block((tmp_path / "page.md").read_text(), "summary").splitlines()
            if line.startswith("| ") and not line.startswith("| area")]
    assert [row.split(" | ")[0] for row in rows] == ["| TCPStore", "| TCPStore", "| DDP",
                                                     "| ZeRO"]
    assert rows[2:] == [ddp, hand]


def test_a_page_without_the_markers_is_refused(tmp_path: Path) -> None:
    (tmp_path / "page.md").write_text("# Benchmarks\n\nNo markers here.\n")
    _write_results(tmp_path / "out", store=("store", STORE))
    done = _render(tmp_path, "--only", "store")
    assert done.returncode != 0
    assert "the page needs exactly one '<!-- bench/all.py: begin store -->'" in done.stderr
    assert (tmp_path / "page.md").read_text() == "# Benchmarks\n\nNo markers here.\n"


def test_the_figure_without_matplotlib_is_refused_before_anything_runs(tmp_path: Path) -> None:
    fake = tmp_path / "no_matplotlib"
    fake.mkdir()
    (fake / "matplotlib.py").write_text("raise ImportError('not installed here')\n")
    (tmp_path / "page.md").write_text(PAGE)
    _write_results(tmp_path / "out", collectives=("collectives", COLLECTIVES))
    done = subprocess.run([sys.executable, str(ALL), "--only", "collectives", "--out",
                           str(tmp_path / "out"), "--page", str(tmp_path / "page.md"),
                           "--plot", str(tmp_path / "busbw.png")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(fake)})
    assert done.returncode == 2
    assert "the figure needs matplotlib: pip install 'ringtorch[plot]'" in done.stderr
    assert "# collectives:" not in done.stderr  # no benchmark ran
    assert (tmp_path / "page.md").read_text() == PAGE


def test_a_result_of_another_format_is_refused(tmp_path: Path) -> None:
    (tmp_path / "page.md").write_text(PAGE)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "store.json").write_text(json.dumps([{"size": "tiny"}]))  # old rpc.py
    done = _render(tmp_path, "--only", "store")
    assert done.returncode == 2
    assert "store.json: not a benchmark result of format 1" in done.stderr
    assert (tmp_path / "page.md").read_text() == PAGE


def test_an_unknown_area_is_refused(tmp_path: Path) -> None:
    done = _render(tmp_path, "--only", "store,nccl")
    assert done.returncode == 2
    assert "--only: unknown area nccl" in done.stderr


def test_the_real_page_has_a_block_for_every_area() -> None:
    spec = importlib.util.spec_from_file_location("bench_all", ALL)
    assert spec is not None and spec.loader is not None
    bench_all = importlib.util.module_from_spec(spec)
    sys.modules["bench_all"] = bench_all  # its dataclass looks its module up there
    path = list(sys.path)  # it puts bench/ on sys.path for its helpers
    try:
        spec.loader.exec_module(bench_all)
    finally:
        del sys.modules["bench_all"]
        sys.path[:] = path
    pages = (ROOT / "BENCHMARKS.md").read_text() + bench_all.DETAILS.read_text()
    for area in [*bench_all.AREAS, bench_all.SUMMARY]:
        assert pages.count(f"<!-- bench/all.py: begin {area} -->") == 1, area
        assert pages.count(f"<!-- bench/all.py: end {area} -->") == 1, area
    page = (ROOT / "BENCHMARKS.md").read_text()
    assert "](docs/img/busbw.png)" in page and (ROOT / "docs/img/busbw.png").exists()


def test_the_real_page_is_short_and_opens_with_the_summary_table() -> None:
    raw = (ROOT / "BENCHMARKS.md").read_bytes()
    assert len(raw) < 25_000, f"BENCHMARKS.md is {len(raw)} bytes: move tables to " \
        "docs/benchmarks/details.md"
    page = raw.decode()
    assert re.findall(r"^## .*", page, flags=re.M)[0] == "## Summary"
    first_table = page.index("\n| ")
    assert page.index("<!-- bench/all.py: begin summary -->") < first_table < page.index(
        "<!-- bench/all.py: end summary -->")
    assert page[first_table:].startswith("\n| area | anchor | ringtorch against the anchor |")
    assert "](docs/benchmarks/details.md)" in page

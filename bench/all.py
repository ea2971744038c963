"""Every benchmark of the page in one run: BENCHMARKS.md's tables and the bus-bandwidth plot.

    python bench/all.py                        # every area, about 4 min on 2 quiet cores
    python bench/all.py --only store,rpc       # some areas; the page's other tables stay
    python bench/all.py --quick --only store   # tiny settings, to check the plumbing
    python bench/all.py --render-only          # rewrite the page from the JSON in --out
    python -m bench.all ...                    # the same, from the repository root

Each area runs its script (bench/store.py, rendezvous_sim.py, collectives.py, hierarchical.py,
ddp.py, rpc.py, mpi_overhead.py, dist_autograd.py, fsdp.py, dtensor.py, recorder.py) with the
settings below and ``--json OUT/AREA.json`` (bench/_report.py's format: the results with the
machine, commit, date and load), then its generated block is rewritten from that file
(bench/_page.py), in BENCHMARKS.md or, for the tables the page only links to,
docs/benchmarks/details.md, and so are its rows of the page's opening summary table
(bench/_summary.py); the hand-written text around the blocks stays. The collectives area also
draws docs/img/busbw.png (matplotlib: ``pip install 'ringtorch[plot]'``). A failed benchmark
keeps its old block and makes the run exit 1.
Run it on a quiet machine: every table is a measurement, and another job on the same cores
changes the numbers by 2-5x.

With --quick the JSON goes to bench/out/quick/ and the pages and the plot to that folder too
(BENCHMARKS.md, details.md, busbw.png) unless --out, --page and --plot say otherwise, so checking the
plumbing never puts tiny-run numbers on the real page or among a full run's results.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))  # the helpers beside this file, also under `python -m bench.all`

import _page  # noqa: E402
import _plot  # noqa: E402
import _report  # noqa: E402
import _summary  # noqa: E402


@dataclass(frozen=True)
class Area:
    script: str
    full: tuple[str, ...]
    quick: tuple[str, ...]
    timeout_s: float = 1200.0


_LIBS = ("--libs", "shm,sockets,gloo,mpi")
AREAS: dict[str, Area] = {
    "store": Area("store.py", ("--clients", "4,32,256", "--seconds", "1", "--rounds", "3"),
                  ("--seconds", "0.2", "--clients", "2")),
    # 4,096 simulated ranks take more than half an hour per store on 2 cores
    "rendezvous": Area("rendezvous_sim.py", ("--ranks", "1024,4096"),
                       ("--ranks", "64", "--procs", "2"), timeout_s=3 * 3600.0),
    "collectives": Area("collectives.py",
                        ("--world-sizes", "2,4", "--ops", "all_reduce", *_LIBS, "--sizes",
                         "1K..64M", "--repeat", "2", "--max-iters", "200"),
                        ("--world-sizes", "2", "--ops", "all_reduce", *_LIBS, "--sizes",
                         "1K,64K", "--max-iters", "20")),
    "shm": Area("collectives.py",
                ("--world-sizes", "2", "--ops", "broadcast,all_gather,reduce_scatter", *_LIBS,
                 "--sizes", "1K..64M", "--repeat", "2", "--max-iters", "200"),
                ("--world-sizes", "2", "--ops", "broadcast", *_LIBS, "--sizes", "1K,64K",
                 "--max-iters", "20")),
    "hierarchy": Area("hierarchical.py",
                      ("--ops", "all_reduce,broadcast,all_gather,reduce_scatter,barrier",
                       "--repeat", "2"),
                      ("--ops", "all_reduce,barrier", "--sizes", "1K,64K", "--repeat", "1",
                       "--max-iters", "20")),
    "ddp": Area("ddp.py", ("--rounds", "3", "--steps", "8"),
                ("--rounds", "1", "--steps", "2", "--warmup", "1", "--widths", "64", "128", "64")),
    "rpc": Area("rpc.py", ("--rounds", "3"), ("--rounds", "1", "--sizes", "tiny")),
    "mpi": Area("mpi_overhead.py", (), ("--max-bytes", "16K", "--seconds", "0.02")),
    "autograd": Area("dist_autograd.py", ("--rounds", "3", "--steps", "200"),
                     ("--rounds", "1", "--steps", "20")),
    "fsdp": Area("fsdp.py", ("--rounds", "3", "--steps", "10"),
                 ("--world-sizes", "2", "--rounds", "1", "--steps", "2", "--warmup", "1")),
    "dtensor": Area("dtensor.py", ("--rounds", "7"),
                    ("--bytes", "65536", "--rounds", "1", "--iters", "5")),
    "recorder": Area("recorder.py", ("--repeats", "5"), ("--quick",)),
}
PLOT_AREA = "collectives"
SUMMARY = "summary"  # the page's first table, rows from every area's result (bench/_summary.py)
DETAILS = ROOT / "docs" / "benchmarks" / "details.md"  # the tables the page links to


def regenerate_command(area: str) -> str:
    return f"python bench/all.py --only {area}"


def run_area(area: str, out: Path, quick: bool) -> bool:
    """Run one area's benchmark, its JSON to out/AREA.json; False when it failed."""
    spec = AREAS[area]
    path = out / f"{area}.json"
    path.unlink(missing_ok=True)  # a failed run must not leave an older result to render
    cmd = [sys.executable, str(BENCH / spec.script), *(spec.quick if quick else spec.full),
           "--json", str(path)]
    started = time.monotonic()
    print(f"# {area}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    try:
        done = subprocess.run(cmd, cwd=ROOT, timeout=spec.timeout_s / (4 if quick else 1))
        ok = done.returncode == 0 and path.exists()
    except subprocess.TimeoutExpired:
        ok = False
    print(f"# {area}: {'done' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s",
          file=sys.stderr, flush=True)
    return ok


def render(areas: list[str], out: Path, page: Path, plot: Path | None,
           details: Path | None = None) -> list[str]:
    """Rewrite the blocks of ``areas`` that have a result in ``out`` (in ``page`` or, for the
    areas whose markers are there, in ``details``) and their rows of the page's summary,
    then the figure; return the areas without a result."""
    blocks, envs, missing = {}, {}, []
    for area in areas:
        path = out / f"{area}.json"
        if not path.exists():
            missing.append(area)
            continue
        envs[area] = _report.read(path)
        blocks[area] = _page.block(area, envs[area], regenerate_command(area))
    texts = {page: page.read_text()}
    if details is not None:
        texts[details] = details.read_text()
    blocks[SUMMARY] = _summary.render(_page.block_text(texts[page], SUMMARY), envs)
    for path, text in _page.splice_pages(texts, blocks).items():
        if text != texts[path]:
            path.write_text(text)
    if plot is not None and PLOT_AREA in blocks:
        env = _report.read(out / f"{PLOT_AREA}.json")
        plot.parent.mkdir(parents=True, exist_ok=True)
        _plot.busbw_plot(env["results"]["cells"], str(plot), ["all_reduce"],
                   title=(env.get("date") or "")[:10])
    return missing


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help=f"comma-separated areas, of {', '.join(AREAS)}")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and rounds: checks that everything runs, in a minute")
    parser.add_argument("--out", type=Path, help="where the raw JSON goes (default bench/out/; "
                        "with --quick bench/out/quick/, so that a quick run never replaces a "
                        "full run's results)")
    parser.add_argument("--page", type=Path, help="the page to write (default BENCHMARKS.md; "
                        "with --quick OUT/BENCHMARKS.md, a copy of it)")
    parser.add_argument("--details", type=Path, help="the page of detail tables the main page "
                        "links to (default docs/benchmarks/details.md when --page is not given; "
                        "with --quick OUT/details.md, a copy of it)")
    parser.add_argument("--plot", type=Path, help="the bus-bandwidth figure (default "
                        "docs/img/busbw.png; with --quick OUT/busbw.png)")
    parser.add_argument("--no-plot", action="store_true", help="leave the figure as it is")
    parser.add_argument("--render-only", action="store_true",
                        help="run nothing: rewrite the page from the JSON already in --out")
    args = parser.parse_args(argv)
    args.areas = list(AREAS) if not args.only else args.only.split(",")
    unknown = [a for a in args.areas if a not in AREAS]
    if unknown:
        parser.error(f"--only: unknown area {', '.join(unknown)} (known: {', '.join(AREAS)})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = args.out or BENCH / "out" / ("quick" if args.quick else "")
    args.out.mkdir(parents=True, exist_ok=True)
    page = args.page or (args.out / "BENCHMARKS.md" if args.quick else ROOT / "BENCHMARKS.md")
    details = args.details or (None if args.page else
                               args.out / "details.md" if args.quick else DETAILS)
    plot = None if args.no_plot else args.plot or (
        args.out / "busbw.png" if args.quick else ROOT / "docs/img/busbw.png")
    if plot is not None and PLOT_AREA in args.areas and not _plot.available():
        # said now, not after the benchmarks have run
        print("bench/all.py: the figure needs matplotlib: pip install 'ringtorch[plot]' "
              "(or leave it as it is with --no-plot)", file=sys.stderr)
        return 2
    if args.quick and args.page is None:
        page.write_text((ROOT / "BENCHMARKS.md").read_text())
        if args.details is None and details is not None:
            details.write_text(DETAILS.read_text())
    failed = []
    if not args.render_only:
        machine, before = _report.machine(), _report.load_average()
        print(f"# {machine['cpu']}, {machine['cores']} cores; load average before: {before}",
              file=sys.stderr, flush=True)
        failed = [a for a in args.areas if not run_area(a, args.out, args.quick)]
        print(f"# load average after: {_report.load_average()}", file=sys.stderr)
    try:
        missing = render(args.areas, args.out, page, plot, details)
    except ValueError as exc:  # a page without the markers, a result of another format
        print(f"bench/all.py: {exc}", file=sys.stderr)
        return 2
    drawn = plot is not None and PLOT_AREA in args.areas and PLOT_AREA not in missing
    print(f"# wrote {page}" + (f" and {plot}" if drawn else ""), file=sys.stderr)
    if failed or missing:
        print(f"# no result (their blocks are unchanged): {', '.join(failed or missing)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The one JSON format every benchmark writes with ``--json PATH``, read by bench/all.py.

An envelope says where and when the numbers were taken, so that a table can always be shown
with its machine and load; ``results`` is the benchmark's own part (its layout is described
by the script that writes it and read by bench/_page.py):

    {"format": 1, "bench": "store", "command": "python bench/store.py --rounds 3",
     "date": "2026-11-24T21:00:00Z", "commit": "900ef8a",
     "machine": {"cpu": "Intel(R) Xeon(R) ...", "cores": 2},
     "load": {"before": [1.2, 1.5, 1.9], "after": [1.4, 1.5, 1.9]},
     "results": {...}}

``load`` holds the 1, 5 and 15 minute load averages (what ``uptime`` prints) when the script
started and when it wrote the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FORMAT = 1
ROOT = Path(__file__).resolve().parents[1]


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    """CPU model and the cores this process may run on."""
    cpu = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:  # not Linux: the platform's name is the best we have
        import platform

        cpu = platform.processor() or platform.machine()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": cores}


def commit() -> str | None:
    """The checked-out commit (with ``+`` when the tree has changes), or None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def command(argv: list[str] | None = None) -> str:
    """This run's command line, the script relative to the repository, without --json."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]).resolve()
    try:
        argv[0] = str(script.relative_to(ROOT))
    except ValueError:
        argv[0] = script.name
    out, skip = ["python", argv[0]], False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg == "--json":
            skip = True
        elif not arg.startswith("--json="):
            out.append(arg)
    return " ".join(out)


class Recorder:
    """Made when a benchmark starts (it notes the load then); ``write`` adds the results."""

    def __init__(self, bench: str) -> None:
        self.bench = bench
        self.load_before = load_average()
        self.date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def envelope(self, results: Any) -> dict[str, Any]:
        return {"format": FORMAT, "bench": self.bench, "command": command(), "date": self.date,
                "commit": commit(), "machine": machine(),
                "load": {"before": self.load_before, "after": load_average()},
                "results": results}

    def write(self, path: str | os.PathLike[str] | None, results: Any) -> None:
        if path is None:
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.envelope(results), indent=1) + "\n")


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An envelope, checked for the format this code reads."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT or "results" not in data:
        raise ValueError(f"{path}: not a benchmark result of format {FORMAT}")
    return data

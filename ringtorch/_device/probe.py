"""The GPU check's first stage: ``python -m ringtorch._device.probe OUTDIR``.

Runs each check of ``probe_checks.py`` on its own (one failing or not applying never hides
the others) and writes ``probe.json`` and ``probe.txt`` into OUTDIR after every check, so a
probe killed by its time limit still leaves what it found. A failure is recorded with its
traceback. Exit status: 0 when no check failed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import traceback
from typing import Any


def _text(results: list[dict[str, Any]]) -> str:
    lines = []
    for result in results:
        lines.append(f"== {result['check']}: {result['status']} ({result['seconds']:.1f} s)")
        if "result" in result:
            for key, value in result["result"].items():
                lines.append(f"   {key}: {value}")
        if "error" in result:
            lines.extend("   " + line for line in result["error"].rstrip().splitlines())
    counts = _counts(results)
    lines.append("probe: " + ", ".join(f"{n} {status}" for status, n in counts.items()))
    return "\n".join(lines) + "\n"


def _counts(results: list[dict[str, Any]]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "not run": 0}
    for result in results:
        counts[result["status"]] = counts.get(result["status"], 0) + 1
    return counts


def _write(outdir: str, results: list[dict[str, Any]]) -> None:
    for name, text in (("probe.json", json.dumps({"checks": results, "counts": _counts(results)},
                                                 indent=1, default=str)),
                       ("probe.txt", _text(results))):
        path = os.path.join(outdir, name)
        with open(path + ".tmp", "w") as out:
            out.write(text)
        os.replace(path + ".tmp", path)


def run(outdir: str) -> int:
    # imported here: a failing import is the probe's first recorded failure, not a crash
    results: list[dict[str, Any]] = []
    start = time.perf_counter()
    try:
        from ringtorch._device import probe_checks
    except Exception:
        results.append({"check": "import", "status": "failed", "seconds": 0.0,
                        "error": traceback.format_exc()})
        _write(outdir, results)
        return 1
    for check in probe_checks.CHECKS:
        start = time.perf_counter()
        entry: dict[str, Any] = {"check": check.__name__, "seconds": 0.0,
                                 "status": "killed while running"}
        _write(outdir, [*results, entry])  # what a probe killed by its time limit leaves
        try:
            entry["result"] = check()
            entry["status"] = "passed"
        except probe_checks.NotRun as why:
            entry["status"] = "not run"
            entry["error"] = str(why)
        except Exception:  # SystemExit (the time limit) leaves "killed while running"
            entry["status"] = "failed"
            entry["error"] = traceback.format_exc()
        entry["seconds"] = time.perf_counter() - start
        results.append(entry)
        _write(outdir, results)
        print(f"probe: {entry['check']}: {entry['status']}", flush=True)
    return 1 if _counts(results)["failed"] else 0  # the checks that did not run do not fail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir")
    args = parser.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    # a time limit's SIGTERM exits through the finalizers (the simulated runtime's segments)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    raise SystemExit(run(args.outdir))


if __name__ == "__main__":
    main()

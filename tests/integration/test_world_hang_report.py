"""Hang reports across a changed world, under real ringrun (--on-worker-failure continue).

World 3: the rank started as 1 is SIGKILLed and the survivors shrink; the one started as 2
(now rank 1) stalls while rank 0 waits for it. ringrun's report on SIGUSR1 asks the current
world only (the dead rank is neither asked nor waited for) and names the survivors as their
own reports do, "rank 1 (was 2)". Then ringrun's replacement for rank 1 joins and the world
is whole again; a collective that two ranks (the replacement and a survivor) call and the
third skips times out on both, and both name the same single report.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ringtorch.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]
RINGRUN = Path(sys.executable).parent / "ringrun"
JOB = ROOT / "tests" / "integration" / "_world_report_job.py"


def test_reports_ask_the_current_world_and_a_grown_world_makes_one_report(
        tmp_path: Path) -> None:
    ringrun = subprocess.Popen(
        [str(RINGRUN), "--nproc-per-node", "3", "--on-worker-failure", "continue",
         "--max-restarts", "1", "--no-summary", str(JOB), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    saved = Path(tempfile.gettempdir()).glob
    try:
        wait_for(lambda: (tmp_path / "stalled").exists() and (tmp_path / "waiting").exists(),
                 60, "the survivors' stall", interval=0.05)
        ringrun.send_signal(signal.SIGUSR1)
        (path,) = wait_for(lambda: list(saved(f"hang-report-ringrun-*-{ringrun.pid}.txt")),
                           30, "ringrun's report", interval=0.05)
        report = wait_for(lambda: path.read_text().endswith("\n") and path.read_text(), 5)
        (tmp_path / "ask").touch()
        asked = tmp_path / "debug-report.txt"
        debug = wait_for(lambda: asked.exists() and asked.read_text(), 30, "the debug report")
        (tmp_path / "release").touch()
        out, err = ringrun.communicate(timeout=90)
    finally:
        if ringrun.poll() is None:
            ringrun.kill()
            ringrun.communicate()
        for old in saved(f"hang-report-ringrun-*-{ringrun.pid}.txt"):
            os.unlink(old)
    assert ringrun.returncode == 0, out + err
    assert report.startswith("=== ringtorch hang report: 2 rank(s) ===\n"
                             "why: ringrun received SIGUSR1\n"), report
    assert debug.startswith("=== ringtorch hang report: 2 rank(s) ===\n"
                            "why: asked by python -m ringtorch.distributed.debug"), debug
    for text in (report, debug):  # the dead rank is not asked: no "rank 1:" line
        assert "did not answer" not in text and "rank 1:" not in text, text
        assert re.search(r"group '[^']+' \(ranks 0, 1 \(was 2\)\):\n  rank 0: in allreduce #0 "
                         r"\(16 bytes, float32\), (queued|running) at .*\n  rank 1 \(was 2\): "
                         r"no collective on this group yet\n", text), text
        assert "everybody waits for: ranks [1 (was 2)]\n" in text, text
        assert "rank 1 (was 2) is doing:\n" in text, text
    assert "in _wait_file" in report, report  # (the debug report's asker is that rank itself)
    # the grown world: the replacement (1) and a survivor (2) time out and share one report
    records = {int(m[1]): json.loads(m[2]) for m in re.finditer(r"worker (\d): (.*)", out)}
    assert sorted(records) == [0, 1, 2] and all(r["world"] == 3 for r in records.values()), out
    errors = {slot: r["error"] for slot, r in records.items() if "error" in r}
    assert sorted(errors) == [1, 2], out + err
    paths = {re.search(r"\(hang report: (.*?)\)$", e).group(1) for e in errors.values()}
    assert len(paths) == 1, errors
    (grown,) = paths
    try:
        text = Path(grown).read_text()
    finally:
        os.unlink(grown)
    assert text.startswith("=== ringtorch hang report: 3 rank(s) ===\n"), text
    assert "everybody waits for: ranks [0]\n" in text, text

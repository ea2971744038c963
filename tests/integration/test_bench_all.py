"""``bench/all.py --quick`` runs a benchmark end to end and writes its table.

The tiny settings only check the plumbing (the script runs, writes its JSON, the table lands
in a copy of the page); the numbers of such a run mean nothing, and the real page is left
alone.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

# long (runs benchmark scripts end to end: 36 s, and 45 s more for fsdp and dtensor at load
# 25): in the slow stage, not the default suite
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_a_quick_store_run_measures_and_writes_its_table(tmp_path: Path) -> None:
    before = (ROOT / "BENCHMARKS.md").read_text()
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "all.py"), "--quick", "--only",
                           "store", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (ROOT / "BENCHMARKS.md").read_text() == before
    result = json.loads((tmp_path / "store.json").read_text())
    assert result["format"] == 1 and result["bench"] == "store"
    assert result["command"] == "python bench/store.py --seconds 0.2 --clients 2"
    assert len(result["load"]["before"]) == 3 and result["machine"]["cores"] >= 1
    page = (tmp_path / "BENCHMARKS.md").read_text()
    block = page[page.index("<!-- bench/all.py: begin store -->"):
                 page.index("<!-- bench/all.py: end store -->")]
    assert "regenerate: `python bench/all.py --only store`" in block
    rows = result["results"]["rows"]
    assert [(row["clients"], row["op"]) for row in rows] == [
        (2, op) for op in ("set", "get", "add", "wait", "multi_get")]
    for row in rows:
        line = re.search(rf"^\| 2 \| {row['op']} \| ([\d,]+) \| ([\d,]+) \| ([\d.,]+)x \|",
                         block, re.MULTILINE)
        assert line is not None, block
        torch_rate, ring_rate, ratio = (float(g.replace(",", "")) for g in line.groups())
        assert torch_rate == round(row["torch_ops_s"])
        assert ring_rate == round(row["ringtorch_ops_s"])
        assert abs(ratio - row["ringtorch_ops_s"] / row["torch_ops_s"]) <= 0.01 * ratio + 0.005
    # the page's summary has the store's row of this run
    summary = page[page.index("<!-- bench/all.py: begin summary -->"):
                   page.index("<!-- bench/all.py: end summary -->")]
    (store_row,) = [line for line in summary.splitlines() if line.startswith("| TCPStore |")]
    assert f"| {result['date'][:10]}" in store_row, store_row


def test_a_quick_recorder_run_measures_both_transports_and_writes_its_table(
        tmp_path: Path) -> None:
    from ringtorch import _config

    done = subprocess.run([sys.executable, str(ROOT / "bench" / "all.py"), "--quick", "--only",
                           "recorder", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "recorder.json").read_text())
    assert result["bench"] == "recorder" and result["command"] == "python bench/recorder.py --quick"
    results = result["results"]
    tracing = "RINGTORCH_TRACE" in _config.KNOBS
    assert results["tracing"] is tracing
    assert [row["transport"] for row in results["rows"]] == ["shm", "sockets"]
    for row in results["rows"]:
        assert row["off_us"] > 0 and row["ring_us"] > 0 and row["default_us"] > 0
        assert (row["trace_us"] is None) is not tracing
    record = results["per_record"]
    assert all(record[k] > 0 for k in ("off_ns", "ring_ns", "on_ns"))
    assert "counting_ns" in record
    page = (tmp_path / "BENCHMARKS.md").read_text()
    block = page[page.index("<!-- bench/all.py: begin recorder -->"):
                 page.index("<!-- bench/all.py: end recorder -->")]
    for row in results["rows"]:
        line = re.search(rf"^\| {row['transport']} \| [\d,.]+ \| [\d,.]+ \| ([\d.]+) \| "
                         rf"[\d,.]+ \| ([\d.]+) \|", block, re.MULTILINE)
        assert line is not None, block
        assert abs(float(line[1]) - row["ring_us"] / row["off_us"]) <= 0.0006
        assert abs(float(line[2]) - row["default_us"] / row["off_us"]) <= 0.0006
    if not tracing:
        assert "not available" in block


def test_quick_fsdp_and_dtensor_runs_write_their_tables_and_targets(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "all.py"), "--quick", "--only",
                           "fsdp,dtensor", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    fsdp = json.loads((tmp_path / "fsdp.json").read_text())["results"]
    (row,) = fsdp["rows"]
    assert row["world"] == 2
    assert row["vs_gloo"] == row["fsdp2_ringtorch_s"] / row["fsdp2_gloo_s"]
    assert row["vs_ddp"] == row["fsdp2_ringtorch_s"] / row["ddp_ringtorch_s"]
    dtensor = json.loads((tmp_path / "dtensor.json").read_text())["results"]
    assert dtensor["world"] == 2 and dtensor["bytes"] == 65536
    assert dtensor["ratio"] == dtensor["gloo_s"] / dtensor["ringtorch_s"]
    details = (tmp_path / "details.md").read_text()
    block = details[details.index("<!-- bench/all.py: begin fsdp -->"):
                    details.index("<!-- bench/all.py: end fsdp -->")]
    assert f"| 2 | {row['fsdp2_ringtorch_s'] * 1e3:.1f} | {row['fsdp2_gloo_s'] * 1e3:.1f} |" \
        in block, block
    page = (tmp_path / "BENCHMARKS.md").read_text()
    summary = page[page.index("<!-- bench/all.py: begin summary -->"):
                   page.index("<!-- bench/all.py: end summary -->")]
    rows = [line for line in summary.splitlines() if line.startswith("| FSDP2 step")]
    verdict = "PASS" if row["vs_gloo"] <= 0.5 else "**FAIL**"
    assert f"| world 2: step ≤ 0.5x gloo's | {row['vs_gloo']:.2f}x | {verdict} |" in rows[0]
    (dt_row,) = [line for line in summary.splitlines() if line.startswith("| DTensor")]
    assert f"{dtensor['ratio']:.2f}x" in dt_row

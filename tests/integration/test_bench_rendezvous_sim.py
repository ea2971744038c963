"""``bench/rendezvous_sim.py`` at a small size: it runs against both stores, reports every
field of its table, and the traffic it replays per rank is what ringtorch really sends.

The simulator's per-rank request counts are checked against a real init_process_group +
new_group (world 2, counted by the store client's ``statistics()``), so a change to what ranks
send at start makes the simulation fail here instead of measuring stale traffic.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ringtorch.testing import run_ranks
from tests.integration import _rendezvous_cost_ranks as ranks

# long (64 simulated ranks against both stores, then a real world-2 start: 40-120 s on 2
# loaded cores, each store's server and drivers started afresh): in the slow stage only
pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_simulation_reports_each_store_and_replays_the_real_traffic(
        tmp_path: Path) -> None:
    out = tmp_path / "rendezvous.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "rendezvous_sim.py"), "--ranks",
                           "64", "--procs", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["bench"] == "rendezvous" and result["format"] == 1
    results = result["results"]
    assert results["procs"] == 2 and results["fd_limit"] > 0
    rows = {row["store"]: row for row in results["rows"]}
    assert sorted(rows) == ["ringtorch", "torch"]
    for row in rows.values():
        assert row["ranks"] == 64 and row["procs"] == 2
        assert 0 < row["median_s"] <= row["last_s"] < 300
        assert row["server_cpu_s"] > 0 and 0 < row["server_rss_mib"] <= row[
            "server_peak_rss_mib"]
        assert row["connect_s"] > 0
    # the same calls for both stores; ringtorch's client counted the requests it really sent
    assert rows["torch"]["calls_per_rank"] == rows["ringtorch"]["calls_per_rank"]
    calls = rows["ringtorch"]["calls_per_rank"]
    assert rows["ringtorch"]["wire_requests_per_rank"] == calls["init"] + calls["new_group"]
    assert rows["torch"]["wire_requests_per_rank"] is None
    # ... and they are what a real rank sends to start a job and make a group: rank 0 of a
    # world of 2, which reads the addresses of a rank above it as every simulated rank but the
    # last does (the most calls, which the simulation reports), less its wait at the master for
    # every rank to join, which the simulation leaves out
    real = run_ranks(ranks.group_requests, 2, timeout=120)[0]
    assert real["init"]["wait_count"] == 1
    assert calls == {"init": sum(real["init"].values()) - 1,
                     "new_group": sum(real["new_group"].values())}
    # the table lands in the page: a row per (ranks, store)
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import _page
    finally:
        sys.path.remove(str(ROOT / "bench"))
    table = _page.render_rendezvous(results)
    for store, row in rows.items():
        assert f"| 64 | {store} | {row['last_s']:.2f} | {row['median_s']:.2f} |" in table

"""A hang after a shrink is reported in the shrunk world's numbering.

World 3, real processes: rank 1 is SIGKILLed, the survivors (started as 0 and 2) shrink to
ranks 0 and 1, then the one started as rank 2 skips an all_reduce. The other's stall warning
and timeout name the late rank by its number in the shrunk group; its hang report asks the
survivors only (not the dead rank, which would cost a wait and name a process that is gone)
and names the culprit "rank 1 (was 2)", with the line it waits on. The expected numbers and
line come from the rank code, never from the report's code.
"""

from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

from ringtorch.testing import run_ranks
from tests.integration import _shrink_hang_ranks as ranks


def _line(marker: str) -> int:
    lines, first = inspect.getsourcelines(ranks.stalls_after_a_shrink)
    return first + next(i for i, text in enumerate(lines) if marker in text)


def test_a_hang_after_a_shrink_names_the_late_rank_by_its_new_and_its_old_number() -> None:
    results = run_ranks(ranks.stalls_after_a_shrink, 3, args=(1, 2), timeout=90,
                        env={"RINGTORCH_STALL_WARNING_S": "1"})
    assert results[1] == {"victim_signal": 9}
    assert results[2] == {"new_rank": 1, "skipped": True}
    got = results[0]
    assert got["new_rank"] == 0
    group = got["group"]
    assert group != "0"  # the shrunk world is a new group
    what = f"all_reduce #1 (float32, 256 bytes, op SUM) on group '{group}' (rank 0)"
    assert got["error"].startswith(f"{what} timed out after 0:00:03"), got["error"]
    assert "ranks [1] did not arrive (rank 1 is at all_reduce #0" in got["error"], got["error"]
    assert got["warnings"] and all(w.startswith(f"{what} has waited") and "ranks [1]" in w
                                   for w in got["warnings"]), got["warnings"]
    path = re.search(r"\(hang report: (.*)\)$", got["error"]).group(1)
    try:
        report = Path(path).read_text()
    finally:
        os.unlink(path)
    assert report.startswith("=== ringtorch hang report: 2 rank(s) ===\n"), report
    assert "did not answer" not in report, report  # the dead rank was not asked
    assert f"group '{group}' (ranks 0, 1 (was 2)):\n" in report, report
    assert "group '0' (ranks 0, 1 (was 2), no longer in use):\n" in report, report
    assert ("  first divergence: allreduce #1 (256 bytes, float32): ranks [1 (was 2)] did not "
            "arrive; ranks [0] are waiting in it\n") in report, report
    assert "everybody waits for: ranks [1 (was 2)]\n" in report, report
    assert "rank 1 (was 2) is doing:\n" in report, report
    assert (f'File "{ranks.__file__}", line {_line("HANG.store.wait")} in '
            f'stalls_after_a_shrink') in report, report

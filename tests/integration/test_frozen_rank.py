"""A frozen rank (SIGSTOP, or a long C call) fails every live rank at the group's timeout.

World 3, rank 2 frozen between two all_reduces, on each transport of one host: shared
memory, sockets (RINGTORCH_SHM=0) and the hierarchy (hosts faked per rank: the frozen rank
alone on its host, so a leader's socket wait finds it; or beside a leader, whose shared-memory
wait finds it while the other host's leader waits on its socket). Every live rank must raise a
DistError naming rank 2 at most ``BOUND_S`` after its timeout, the first of them not before it
(docs/design/failure-detection.md, G5), and the error must name a hang report that exists
and says everybody waits for rank 2, which is stopped (docs/hang-report.md). When the frozen
rank is rank 0, which serves the job's store, the others still raise on time, saying no report
could be made.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from ringtorch.testing import frozen, run_ranks, wait_for
from tests.integration import _frozen_ranks as ranks

BOUND_S = 0.5
VICTIM = 2
CASES = {
    "shm": ({}, "", r"^1 host: ranks \[0, 1, 2\] through shared memory$"),
    "sockets": ({"RINGTORCH_SHM": "0"}, "", r"^sockets$"),
    "hierarchy-alone": ({}, "aab", r"^2 hosts: \[0, 1\] shm, \[2\] alone"),
    "hierarchy-beside-leader": ({}, "abb", r"^2 hosts: \[0\] alone, \[1, 2\] shm"),
}


def _freeze(victim: int, env: dict[str, str], hosts: str, markers: Path) -> list[dict]:
    """Run the ranks, freezing ``victim`` between its two all_reduces and resuming it once
    the others have raised; every rank's result."""

    def freeze_then_resume() -> None:
        try:
            with frozen(markers / "victim.pid", "the victim's pid file"):
                (markers / "stopped").write_text("")
                for rank in range(3):
                    if rank != victim:
                        wait_for((markers / f"done{rank}").exists, 60, f"rank {rank}'s error")
        finally:
            (markers / "released").write_text("")

    freezer = threading.Thread(target=freeze_then_resume)
    freezer.start()
    try:
        return run_ranks(ranks.frozen_peer, 3, args=(victim, str(markers), hosts), timeout=90,
                         env=env)
    finally:
        (markers / "released").write_text("")
        freezer.join(60)


def _check_live_ranks(results: list[dict], victim: int) -> list[str]:
    """Every live rank's error is a DistError naming ``victim``, raised at most ``BOUND_S``
    after its timeout, and the first of them (whose own timeout it is: the others may learn
    it by the abort) not before; their first lines."""
    live = [rank for rank in range(len(results)) if rank != victim]
    lines = []
    for rank in live:
        res = results[rank]
        assert res["dist_error"], (rank, res)
        first_line = res["message"].splitlines()[0]
        assert re.search(rf"all_reduce #1 .*timed out after 0:00:04 \(Timed out waiting \d+ms: the "
                         rf"collective's timeout\): ranks \[{victim}\] did "
                         rf"not arrive", first_line), (rank, first_line)
        assert res["elapsed"] <= ranks.TIMEOUT_S + BOUND_S, (rank, res)
        lines.append(first_line)
    first = min(live, key=lambda rank: results[rank]["raised_at"])
    assert results[first]["elapsed"] >= ranks.TIMEOUT_S, (first, results[first])
    return lines


@pytest.mark.parametrize("case", list(CASES))
def test_a_frozen_rank_fails_every_live_rank_at_the_timeout_naming_it(
        case: str, tmp_path: Path) -> None:
    env, hosts, topology = CASES[case]
    results = _freeze(VICTIM, env, hosts, tmp_path)
    for res in results:
        assert re.search(topology, res["topology"]), res["topology"]
    assert results[VICTIM]["dist_error"], results[VICTIM]  # resumed: its next calls fail
    reports = set()
    for first_line in _check_live_ranks(results, VICTIM):
        found = re.search(r"\(hang report: (/\S+)\)$", first_line)
        assert found, first_line
        reports.add(found.group(1))
    (path,) = reports  # one report for the group, named by every live rank
    report = Path(path).read_text()
    os.unlink(path)
    assert f"everybody waits for: ranks [{VICTIM}]\n" in report, report
    assert re.search(rf"rank {VICTIM}: did not answer within [\d.]+ s; the process is stopped "
                     rf"\(SIGSTOP or a debugger\): no stacks\n", report), report


@pytest.mark.parametrize("case", ["shm", "sockets"])
def test_a_frozen_store_host_fails_the_others_on_time_without_a_report(
        case: str, tmp_path: Path) -> None:
    # rank 0 serves the job's store: frozen, it cannot take part in a hang report, and the
    # others do not wait out the store's timeout for one
    env, hosts, _ = CASES[case]
    results = _freeze(0, env, hosts, tmp_path)
    for first_line in _check_live_ranks(results, 0):
        assert first_line.endswith(" (hang report: (none: the job's store does not answer))"), \
            first_line

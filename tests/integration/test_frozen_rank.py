"""A frozen rank (SIGSTOP, or a long C call) fails every live rank at the group's timeout.

World 3, rank 2 frozen between two all_reduces, on each transport of one host: shared
memory, sockets (RINGTORCH_SHM=0) and the hierarchy (hosts faked per rank: the frozen rank
alone on its host, so a leader's socket wait finds it; or beside a leader, whose shared-memory
wait finds it while the other host's leader waits on its socket). Every live rank must raise a
DistError naming rank 2 no earlier than the timeout and at most ``BOUND_S`` after it
(docs/design/failure-detection.md, G5), and the error must name a hang report that exists
and says everybody waits for rank 2, which is stopped (docs/hang-report.md).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from ringtorch.testing import run_ranks
from tests.integration import _frozen_ranks as ranks

BOUND_S = 0.5
VICTIM = 2
CASES = {
    "shm": ({}, "", r"^1 host: ranks \[0, 1, 2\] through shared memory$"),
    "sockets": ({"RINGTORCH_SHM": "0"}, "", r"^sockets$"),
    "hierarchy-alone": ({}, "aab", r"^2 hosts: \[0, 1\] shm, \[2\] alone"),
    "hierarchy-beside-leader": ({}, "abb", r"^2 hosts: \[0\] alone, \[1, 2\] shm"),
}


def _wait_file(path: Path, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {seconds} s"
        time.sleep(0.01)


@pytest.mark.parametrize("case", list(CASES))
def test_a_frozen_rank_fails_every_live_rank_at_the_timeout_naming_it(
        case: str, tmp_path: Path) -> None:
    env, hosts, topology = CASES[case]

    def freeze_then_resume() -> None:
        _wait_file(tmp_path / "victim.pid")
        pid = int((tmp_path / "victim.pid").read_text())
        os.kill(pid, signal.SIGSTOP)
        try:
            (tmp_path / "stopped").write_text("")
            for rank in range(3):
                if rank != VICTIM:
                    _wait_file(tmp_path / f"done{rank}")
        finally:
            os.kill(pid, signal.SIGCONT)
            (tmp_path / "released").write_text("")

    freezer = threading.Thread(target=freeze_then_resume)
    freezer.start()
    try:
        results = run_ranks(ranks.frozen_peer, 3, args=(VICTIM, str(tmp_path), hosts),
                            timeout=90, env=env)
    finally:
        (tmp_path / "released").write_text("")
        freezer.join(60)
    reports = set()
    for rank, res in enumerate(results):
        assert re.search(topology, res["topology"]), res["topology"]
        assert res["dist_error"], (rank, res)
        if rank == VICTIM:
            continue
        first_line = res["message"].splitlines()[0]
        assert re.search(rf"all_reduce #1 .*timed out after 0:00:04: ranks \[{VICTIM}\] did not "
                         rf"arrive", first_line), (rank, first_line)
        assert ranks.TIMEOUT_S <= res["elapsed"] <= ranks.TIMEOUT_S + BOUND_S, (rank, res)
        found = re.search(r"\(hang report: (/\S+)\)$", first_line)
        assert found, (rank, first_line)
        reports.add(found.group(1))
    (path,) = reports  # one report for the group, named by every live rank
    report = Path(path).read_text()
    os.unlink(path)
    assert f"everybody waits for: ranks [{VICTIM}]\n" in report, report
    assert re.search(rf"rank {VICTIM}: did not answer within [\d.]+ s; the process is stopped "
                     rf"\(SIGSTOP or a debugger\): no stacks\n", report), report

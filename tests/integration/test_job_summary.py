"""ringrun's end-of-job summary, from real jobs: the straggler is named with a plausible lag,
the totals are what the job did, --no-summary silences it, a failing job prints what it has.

The jobs are tests/integration/_summary_jobs.py, run by ``python -m ringtorch.launcher``; the
expected totals are computed here from the job's description (element counts times element
sizes), not from ringtorch.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path

JOBS = str(Path(__file__).with_name("_summary_jobs.py"))


def ringrun(args: list[str], env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("OMP_NUM_THREADS", None)
    full_env.pop("RINGTORCH_FLIGHT_RECORDER", None)
    return subprocess.run([sys.executable, "-m", "ringtorch.launcher", *args], env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def summary_block(stderr: str) -> list[str]:
    """The summary's lines: its title and the indented lines under it."""
    lines = stderr.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ringrun: job summary"))
    block = [lines[start]]
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def test_the_rank_the_others_wait_for_is_named_with_its_lag(tmp_path: Path) -> None:
    sleep_s = 0.1
    result = ringrun(["--nproc-per-node", "4", "--log-dir", str(tmp_path), JOBS, "straggler"],
                     env={"SLEEP_S": str(sleep_s)})
    assert result.returncode == 0, result.stderr
    block = summary_block(result.stderr)
    assert block[0].startswith("ringrun: job summary (4 ranks")
    ranks = [line for line in block if line.startswith("  rank ")]
    assert [line.split(":")[0] for line in ranks] == [f"  rank {r}" for r in range(4)]
    # 10 all_reduces of 1000 float32 and one broadcast of 10 float32: 40040 bytes, 39.1 KiB.
    for line in ranks:
        assert "collectives" in line and "(11 calls, 39.1 KiB)" in line, line
    assert "p2p" in ranks[0] and "(1 call, 800 B)" in ranks[0]
    assert "p2p" in ranks[1] and "(1 call, 800 B)" in ranks[1]
    assert "p2p" not in ranks[2] and "p2p" not in ranks[3]
    verdict = next(line for line in block if line.startswith("  allreduce:"))
    match = re.match(r"  allreduce: slowest rank (\d): the others waited ([\d.]+) (ms|s) per "
                     r"call for it \(.* over 10 calls;", verdict)
    assert match, verdict
    lag_s = float(match[2]) / (1000 if match[3] == "ms" else 1)
    assert match[1] == "2"
    # Each call, the others wait for rank 2's sleep: less is impossible, much more would be
    # a wrong measure (the bound leaves room for a loaded machine).
    assert 0.7 * sleep_s <= lag_s <= 3 * sleep_s, verdict
    assert not any(line.startswith("  broadcast:") for line in block)  # rooted: no verdict


def test_the_ranks_totals_are_what_the_job_passed(tmp_path: Path) -> None:
    result = ringrun(["--nproc-per-node", "4", "--log-dir", str(tmp_path), JOBS, "straggler"],
                     env={"SLEEP_S": "0"})
    assert result.returncode == 0, result.stderr
    files = sorted(glob.glob(str(tmp_path / "*" / "attempt_0" / "observe" / "summary-*.json")))
    assert [os.path.basename(f) for f in files] == [f"summary-{r}.json" for r in range(4)]
    for rank, name in enumerate(files):
        data = json.loads(Path(name).read_text())
        assert data["format"] == "ringtorch-rank-summary" and data["rank"] == rank
        ops = data["ops"]
        assert ops["allreduce"]["calls"] == 10 and ops["allreduce"]["failed"] == 0
        assert ops["allreduce"]["bytes"] == 10 * 1000 * 4
        assert ops["broadcast"]["calls"] == 1 and ops["broadcast"]["bytes"] == 10 * 4
        assert all(op["kind"] == "collective" for name, op in ops.items()
                   if name not in ("send", "recv"))
        assert ops["allreduce"]["time_ns"] > 0
        if rank == 0:
            assert ops["send"] == {**ops["send"], "kind": "p2p", "calls": 1, "bytes": 800}
        if rank == 1:
            assert ops["recv"] == {**ops["recv"], "kind": "p2p", "calls": 1, "bytes": 800}
        if rank > 1:
            assert "send" not in ops and "recv" not in ops


def test_no_summary_prints_nothing(tmp_path: Path) -> None:
    result = ringrun(["--nproc-per-node", "2", "--no-summary", JOBS, "straggler"],
                     env={"SLEEP_S": "0"})
    assert result.returncode == 0, result.stderr
    assert "summary" not in result.stderr
    assert "collectives" not in result.stderr


def test_a_failing_job_prints_what_its_ranks_left(tmp_path: Path) -> None:
    # Rank 1 raises after three all_reduces; ranks 0 and 2 are then killed by the launcher
    # (SIGTERM: no exit hook runs), and what they show is their last flush.
    result = ringrun(["--nproc-per-node", "3", JOBS, "fails"])
    assert result.returncode == 1
    assert "rank 1 cannot go on" in result.stderr
    block = summary_block(result.stderr)
    assert block[0].startswith("ringrun: job summary (3 ranks:")
    for rank in range(3):
        assert block[1 + rank].startswith(f"  rank {rank}: collectives")
        assert "(3 calls, 11.7 KiB)" in block[1 + rank], block  # 3 x 1000 float32
    assert block[4].startswith("  allreduce: slowest rank ")
    assert len(block) == 5


def test_a_program_that_never_makes_a_group_gets_no_summary(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("print('hello')\n")
    result = ringrun(["--nproc-per-node", "2", str(script)])
    assert result.returncode == 0, result.stderr
    assert "summary" not in result.stderr


def test_an_rpc_job_without_a_process_group_is_summarized(tmp_path: Path) -> None:
    result = ringrun(["--nproc-per-node", "2", JOBS, "rpc"])
    assert result.returncode == 0, result.stderr
    block = summary_block(result.stderr)
    assert block[0].startswith("ringrun: job summary (2 ranks")
    assert block[1].startswith("  rank 0: RPC ") and "(4 calls, " in block[1]
    assert block[2].startswith("  rank 1: no collective, p2p or RPC call in ")


def test_the_observability_pages_program_runs_under_ringrun(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    program = re.search(r"```python\n(.*?)```", text[text.index("### The API"):], re.S)
    assert program, "docs/observability.md has no python block after '### The API'"
    script = tmp_path / "tour.py"
    script.write_text(program.group(1))
    result = ringrun(["--nproc-per-node", "2", str(script)])
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in range(2):
        assert f"rank {rank}: observability tour passed" in result.stdout
    # the summary counts what the program did, flight_recorder.reset() notwithstanding
    block = summary_block(result.stderr)
    assert "(1 call, 1.0 KiB), p2p" in block[1] and "(1 call, 32 B)" in block[1]


def test_each_nodes_launcher_prints_its_own_ranks(tmp_path: Path) -> None:
    # Two launchers on this machine form one 4-rank job (static rendezvous); rank 2, on the
    # second node, is the straggler. Each launcher summarizes the ranks it started.
    from ringtorch.testing.harness import job_port

    common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(job_port())]
    env = {**os.environ, "RINGTORCH_SECRET": "0123456789abcdef" * 4, "SLEEP_S": "0.1"}
    env.pop("OMP_NUM_THREADS", None)
    nodes = [subprocess.Popen([sys.executable, "-m", "ringtorch.launcher", *common,
                               "--node-rank", str(n), JOBS, "straggler"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for n in (0, 1)]
    errs = []
    for node in nodes:
        _, err = node.communicate(timeout=120)
        assert node.returncode == 0, err
        errs.append(err)
    first, second = summary_block(errs[0]), summary_block(errs[1])
    assert first[0].startswith("ringrun: job summary (2 ranks")
    assert [line.split(":")[0] for line in first[1:3]] == ["  rank 0", "  rank 1"]
    assert [line.split(":")[0] for line in second[1:3]] == ["  rank 2", "  rank 3"]
    assert not any("rank 2" in line or "rank 3" in line for line in first)
    verdict = next(line for line in second if line.startswith("  allreduce:"))
    assert verdict.startswith("  allreduce: slowest rank 2: the others waited ")

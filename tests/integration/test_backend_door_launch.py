"""The backend door under each launcher: torchrun (running docs/backend-door.md's example),
ringrun (whose --trace timeline and end-of-job summary see the calls) and mp.spawn meeting at
a tcp:// URL.

Otherwise the job is tests/integration/_door_job.py, a plain torch program; each rank prints
what its all_reduces and broadcast gave, checked here against arithmetic.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from ringtorch.testing.harness import job_port

JOB = str(Path(__file__).with_name("_door_job.py"))
ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def _expected(ws: int) -> list[str]:
    total = float(sum(range(1, ws + 1)))
    # three in-place all_reduces multiply the sum by the world size twice more
    value = total * ws * ws
    return [f"rank {r} of {ws}: all_reduce {value:g} broadcast {ws - 1} backend ringtorch"
            for r in range(ws)]


def _lines(stdout: str, pattern: str = r"rank \d+ of \d+: [\w .]+ringtorch") -> list[str]:
    # the ranks share one pipe: print's text is one write, its newline another, so lines
    # of different ranks may run together; each message itself is whole
    return sorted(re.findall(pattern, stdout))


def test_torchrun_runs_the_docs_example_on_ringtorch(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "backend-door.md").read_text()
    script = tmp_path / "door.py"
    script.write_text(re.search(r"```python\n(.*?)```", text, re.S).group(1))
    result = _run(["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                   str(job_port()), str(script)])
    assert result.returncode == 0, result.stderr
    assert _lines(result.stdout, r"rank \d+: \[[\d., ]+\] on ringtorch") == [
        f"rank {r}: [3.0, 3.0, 3.0, 3.0] on ringtorch" for r in range(2)]


def test_ringrun_traces_and_summarises_the_calls_of_a_plain_torch_program(
        tmp_path: Path) -> None:
    result = _run(["-m", "ringtorch.launcher", "--nproc-per-node", "2", "--master-port",
                   str(job_port()), "--trace", str(tmp_path), JOB])
    assert result.returncode == 0, result.stderr
    assert _lines(result.stdout) == _expected(2)
    ranks = [line for line in result.stderr.splitlines() if line.startswith("  rank ")]
    assert len(ranks) == 2, result.stderr
    for line in ranks:  # three all_reduces of 4 float32 and a broadcast of 2: 56 bytes
        assert "collectives" in line and "(4 calls, 56 B)" in line, line
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    spans = sorted((e["pid"], e["name"]) for e in events if e.get("ph") == "X")
    assert spans == sorted([(r, "allreduce") for r in range(2)] * 3
                           + [(r, "broadcast") for r in range(2)]), spans


def test_mp_spawn_ranks_meet_at_a_tcp_url() -> None:
    result = _run([JOB, "spawn", "2", f"tcp://127.0.0.1:{job_port()}"])
    assert result.returncode == 0, result.stderr
    assert _lines(result.stdout) == _expected(2)

"""The programs in the docs run as written: under ringrun, docs/api.md's tour of the
collectives (3 processes), docs/rpc.md's tour of RPC, distributed autograd and the optimizer
(2 processes) and docs/comm-hooks.md's tour of DDP hooks and model averaging (4 processes); as
plain programs, docs/launching.md's elastic_launch tutorial and its custom rendezvous backend."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# long (runs every program of the docs as written: 48 s): in the slow stage, not the default suite
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def run_doc_program(tmp_path: Path, doc: str, section: str, nproc: int) -> str:
    """Run the first python block of ``doc`` after ``section`` with ringrun; its stdout."""
    text = (ROOT / "docs" / doc).read_text()
    program = re.search(r"```python\n(.*?)```", text[text.index(section):], re.S)
    assert program, f"docs/{doc} has no python block after {section!r}"
    script = tmp_path / "tour.py"
    script.write_text(program.group(1))
    result = subprocess.run([sys.executable, "-m", "ringtorch.launcher", "--nproc-per-node",
                             str(nproc), str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=90, env={**os.environ})
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def test_the_api_tour_in_the_docs_runs_under_ringrun(tmp_path: Path) -> None:
    out = run_doc_program(tmp_path, "api.md", "## A program that runs the examples", 3)
    for rank in range(3):
        assert f"rank {rank}: api tour passed" in out, out[-2000:]


def test_the_rpc_api_tour_in_the_docs_runs_under_ringrun(tmp_path: Path) -> None:
    out = run_doc_program(tmp_path, "rpc.md", "The program below uses every public function", 2)
    assert "rpc tour: all checks passed" in out, out[-2000:]


def test_the_comm_hooks_tour_in_the_docs_runs_under_ringrun(tmp_path: Path) -> None:
    out = run_doc_program(tmp_path, "comm-hooks.md", "## A program that runs the examples", 4)
    for rank in range(4):
        assert f"rank {rank}: comm hooks tour passed" in out, out[-2000:]


def run_doc_script(tmp_path: Path, doc: str, section: str) -> str:
    """Run the first python block of ``doc`` after ``section`` as a plain program; its stdout."""
    text = (ROOT / "docs" / doc).read_text()
    program = re.search(r"```python\n(.*?)```", text[text.index(section):], re.S)
    assert program, f"docs/{doc} has no python block after {section!r}"
    script = tmp_path / "program.py"
    script.write_text(program.group(1))
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env={**os.environ})
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def test_the_elastic_launch_program_in_the_docs_runs(tmp_path: Path) -> None:
    out = run_doc_script(tmp_path, "launching.md", "## From a Python program: elastic_launch")
    assert "rank 0 learned [1.0, -2.0, 0.5]" in out, out


def test_the_custom_rendezvous_program_in_the_docs_runs(tmp_path: Path) -> None:
    out = run_doc_script(tmp_path, "launching.md", "## A custom rendezvous backend")
    assert out.strip() == "{0: 2, 1: 2}", out

"""docs/zero.md's program (ZeroRedundancyOptimizer and Join, every public function) runs as
written under ringrun on 2 processes."""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_doc_programs import run_doc_program


def test_the_zero_tour_in_the_docs_runs_under_ringrun(tmp_path: Path) -> None:
    out = run_doc_program(tmp_path, "zero.md", "## A program that uses every public function", 2)
    for rank in range(2):
        assert f"rank {rank}: zero tour passed" in out, out[-2000:]

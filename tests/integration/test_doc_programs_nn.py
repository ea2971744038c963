"""The nn programs in the docs run as written, under ringrun: docs/nn.md's tour of the
differentiable collectives and its DDP drop-in program (2 processes each), and docs/rpc.md's
tour of RemoteModule (3 processes)."""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_doc_programs import run_doc_program


def test_the_nn_functional_tour_in_the_docs_runs_under_ringrun(tmp_path: Path) -> None:
    out = run_doc_program(tmp_path, "nn.md", "## ringtorch.distributed.nn.functional", 2)
    for rank in range(2):
        assert f"rank {rank}: nn.functional tour passed" in out, out[-2000:]


def test_the_remote_module_tour_in_the_docs_runs_under_ringrun(tmp_path: Path) -> None:
    out = run_doc_program(tmp_path, "rpc.md", "## RemoteModule", 3)
    assert "remote module tour: all checks passed" in out, out[-2000:]


def test_the_ddp_drop_in_program_in_the_docs_runs_under_ringrun(tmp_path: Path) -> None:
    out = run_doc_program(tmp_path, "nn.md", "## ringtorch.nn.parallel: DistributedDataParallel",
                          2)
    for rank in range(2):
        assert f"rank {rank}: ddp drop-in tour passed" in out, out[-2000:]

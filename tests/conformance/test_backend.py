"""The backend conformance suite (``ringtorch.testing.check_backend``) on every backend
configuration ringtorch has, at odd and even worlds.

Every socket algorithm family forced in turn (shared memory off), the shared-memory path, the
hierarchy (ranks spread over fake hosts: shared memory within a host, sockets between the
hosts' leaders), MPI under mpirun, and a backend registered by a user through
``Backend.register_backend`` (the store-based example of docs/testing.md). Each world runs
every case (about 800) in one set of processes.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ringtorch.testing import check_backend
from ringtorch.testing._backend_cases import CaseReport
from ringtorch.testing.backend_check import assert_conforms
from tests.integration._mpi_jobs import ROOT, launch

_RING = "all_reduce=ring,reduce=ring,all_gather=ring,reduce_scatter=ring"
# A small segment makes the pipelined algorithms cut even the small cases into several frames.
SOCKET_ALGORITHMS = {
    "ring+chain": f"{_RING},broadcast=chain,segment=64",
    "direct+tree": "all_reduce=direct,reduce=direct,all_gather=direct,reduce_scatter=direct,"
                   "broadcast=tree",
    "scatter_gather": "all_reduce=scatter_gather,broadcast=chain,segment=64",
    "recursive_doubling": "all_reduce=recursive_doubling,broadcast=tree",
}


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("family", list(SOCKET_ALGORITHMS))
def test_the_native_backend_over_sockets_conforms_with_each_algorithm(family: str,
                                                                       world_size: int) -> None:
    check_backend("gloo", world_size, env={"RINGTORCH_SHM": "0",
                                           "RINGTORCH_ALGORITHMS": SOCKET_ALGORITHMS[family]})


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_the_native_backend_over_shared_memory_conforms(world_size: int) -> None:
    check_backend("gloo", world_size, env={"RINGTORCH_SHM": "1"})


@pytest.mark.parametrize("world_size", [3, 4])
def test_shared_memory_in_tiny_chunks_without_one_shot_rounds_conforms(world_size: int) -> None:
    """Every collective takes many rounds of 256 bytes, and all_reduce the staged plan."""
    check_backend("gloo", world_size, env={"RINGTORCH_SHM": "1", "RINGTORCH_SHM_CHUNK_BYTES": "256",
                                           "RINGTORCH_SHM_ONESHOT_BYTES": "0"})


@pytest.mark.parametrize("hosts", ["aab", "aabb"])
def test_the_hierarchy_across_hosts_conforms(hosts: str) -> None:
    """Ranks on fake hosts ("aab": ranks 0 and 1 on host a, rank 2 on host b)."""
    rank_env = [{"RINGTORCH_HOST_ID": f"host-{h}", "RINGTORCH_SOCKET_ADDR": "127.0.0.1"}
                for h in hosts]
    check_backend("gloo", len(hosts), env={"RINGTORCH_SHM": "1"}, rank_env=rank_env)


def _docs_backend(tmp_path: Path) -> Path:
    """docs/testing.md's backend program, written out as store_backend.py."""
    text = (ROOT / "docs" / "testing.md").read_text()
    program = re.search(r"```python\n(.*?)```", text[text.index("## A backend of your own"):],
                        re.S)
    assert program, "docs/testing.md has no program under '## A backend of your own'"
    path = tmp_path / "store_backend.py"
    path.write_text(program.group(1))
    return path


def _python(script: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script)], cwd=script.parent, capture_output=True,
                          text=True, timeout=180)


def test_the_backend_a_user_registers_in_the_docs_conforms_at_worlds_2_and_3(
        tmp_path: Path) -> None:
    done = _python(_docs_backend(tmp_path))
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().endswith("the store backend conforms")


_BROKEN = """
from store_backend import BackendContext, StoreBackend
from ringtorch.testing import BackendConformanceError, check_backend

class FromRankZero(StoreBackend):
    def broadcast(self, buf, root, o):
        super().broadcast(buf, 0, o)  # the bug: the root is ignored

def make(store, rank, world_size, timeout):
    return FromRankZero(BackendContext(store, rank, world_size, timeout, "broken",
                                       tuple(range(world_size))))

if __name__ == "__main__":
    try:
        check_backend(make, 3)
    except BackendConformanceError as exc:
        print("\\n".join(exc.failures))
"""


def test_the_suite_names_every_case_a_broken_backend_fails_with_its_world_and_rank(
        tmp_path: Path) -> None:
    _docs_backend(tmp_path)
    (tmp_path / "broken.py").write_text(_BROKEN)
    done = _python(tmp_path / "broken.py")
    assert done.returncode == 0, done.stderr[-4000:]
    failures = done.stdout.splitlines()
    assert len(failures) >= 10, done.stdout
    broadcast = re.compile(r"^(async/broadcast|(large/|small/)?broadcast/\w+) "
                           r"\(world 3, rank [012]\): got \[")
    for line in failures:  # every broadcast from root 1 or 2 is wrong on some rank
        assert broadcast.match(line), line


@pytest.mark.parametrize("world_size", [2, 3])
def test_the_mpi_backend_conforms_under_mpirun(
        world_size: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    """World 2 runs at MPI_THREAD_SERIALIZED, world 3 at MPI_THREAD_MULTIPLE (the run that
    tests/integration/test_mpi_backend.py reads too: tests/mpi/backend_ops.py)."""
    books = launch(world_size, tmp_path_factory)
    for book in books:
        assert "traceback" not in book["facade/conformance"], book["facade/conformance"]["traceback"]
    reports: list[CaseReport] = [book["facade/conformance"]["report"] for book in books]
    assert [r.rank for r in reports] == list(range(world_size))
    assert_conforms(reports)

"""Starting MPI jobs from tests: find mpirun, give it the right environment, leave nothing.

Used by tests/integration/test_mpi_backend.py and tests/conformance/test_backend.py (the
conformance suite on the MPI backend). ``run`` kills a job that runs past its time with its
whole process group, waits for its processes to be gone and removes the Open MPI files it
left in /dev/shm.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration._mpi_leftovers import OpenMpiLeftovers, end_session

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "mpi"


def mpirun() -> list[str]:
    """The mpirun command (with --oversubscribe under Open MPI: worlds larger than 2 cores)."""
    found = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which("mpirun")
    assert found, "mpirun not found: install the mpi extra (pip install -e '.[mpi]')"
    version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30)
    open_mpi = "Open MPI" in version.stdout + version.stderr or "prte" in version.stdout.lower()
    return [found, "--oversubscribe"] if open_mpi else [found]


def job_env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, OMPI_ALLOW_RUN_AS_ROOT="1",
                OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", PYTHONWARNINGS="ignore::UserWarning")


def run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run a launcher; on timeout kill its whole process group (no orphaned ranks). Then wait
    for the job's processes to be gone and remove the Open MPI files in /dev/shm it left."""
    shm = OpenMpiLeftovers()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=job_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} ran past {timeout} s:\n{out[-4000:]}")
    finally:  # also when pytest-timeout interrupts us: leave no rank behind
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        end_session(proc.pid)
        shm.clean()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


THREAD_LEVEL = {2: "serialized"}  # the other worlds keep mpi4py's default, "multiple"
_worlds: dict[int, list[dict]] = {}


def launch(n: int, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Every rank's results of one run of tests/mpi/backend_ops.py at world size n, once per
    session (test_mpi_backend.py and the conformance tests read the same run). World 2 runs
    at MPI_THREAD_SERIALIZED (one process-wide lock, torch's way), the others at
    MPI_THREAD_MULTIPLE."""
    if n not in _worlds:
        out = tmp_path_factory.mktemp(f"mpi_world{n}")
        cmd = [*mpirun(), "-n", str(n), sys.executable, str(SCRIPTS / "backend_ops.py"), str(out)]
        if n in THREAD_LEVEL:
            cmd.append(THREAD_LEVEL[n])
        done = run(cmd, timeout=100)
        assert done.returncode == 0, f"mpirun -n {n} failed:\n{done.stdout[-4000:]}"
        _worlds[n] = [pickle.loads((out / f"rank{r}.pkl").read_bytes()) for r in range(n)]
    return _worlds[n]

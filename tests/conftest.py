"""Suite-wide rules: no test may be skipped silently; the suite keeps its secret to itself;
files that share a machine-wide resource never run at the same time.

A skipped test is a test that did not run; on this project's machines every test can run, so
a skip fails the session (set RINGTORCH_ALLOW_SKIPS=1 to look at a partial run locally).

Tests marked ``netns`` need two network namespaces (ringtorch.testing.netns); tests marked
``gpu(n)`` need n visible NVIDIA GPUs and a CUDA build of torch (counted without initialising
CUDA: the harness forks); tests marked ``nccl_lib`` need the NCCL library
(ringtorch._device.nccl_lib). Where that is missing those tests are deselected, never passed
or skipped, and the summary says how many and why.

Processes without RINGTORCH_SECRET use the per-user secret file; the suite points it
(RINGTORCH_SECRET_FILE, inherited by every process a test starts) at a file of its own, so it
never creates or reads the user's ~/.config/ringtorch/secret. The processes a test starts get
a temporary folder (TMPDIR) inside the suite's own, removed when the suite's process exits;
so does what that process itself puts in its temporary folder, pytest's ``tmp_path`` folders
included (run with ``--basetemp DIR`` to keep them for a look after a failure).

``scripts/test.sh`` runs the suite on two pytest-xdist workers, a test file at a time (each
file's tests in one worker, so a module's cached runs and fixtures are made once). Every test
scopes what it checks to its own processes, ports and segments, except where the resource is
named by a program we do not control: Open MPI's segment files in /dev/shm, which the MPI
tests check are all removed. The files that start Open MPI jobs therefore form one unit of
work (SHARED_UNITS) and run one after another on one worker. The files that hold the product
to tight time bounds (a dead or frozen rank named within half a second of its bound) have
the machine to themselves (ALONE): while one of them runs, the other worker waits, as the
suite ran on one process. Run ``pytest`` without ``-n`` (or with ``-n 0``) for one process.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

_secret_dir = tempfile.mkdtemp(prefix="ringtorch-tests-")
os.environ.setdefault("RINGTORCH_SECRET_FILE", os.path.join(_secret_dir, "secret"))
# What the processes a test starts leave in their temporary folder (hang reports named by a
# failed collective's error, ...) goes in the suite's own folder, removed at the end.
os.makedirs(os.path.join(_secret_dir, "tmp"))
os.environ["TMPDIR"] = os.path.join(_secret_dir, "tmp")
# This process has read TMPDIR already (tempfile caches the folder): what runs inside it goes
# there too (torch's launcher, run by the comparison tests, leaves its torchelastic_* log
# folders and a failed worker's pytorch-errorfile-*.pickle behind).
tempfile.tempdir = os.environ["TMPDIR"]
# Removed when this process exits, after multiprocessing has removed its own folder in it
# (atexit runs last what registered first; multiprocessing is not imported yet here).
atexit.register(shutil.rmtree, _secret_dir, True)

# Files that run as one unit of work under xdist, and why (see the docstring).
SHARED_UNITS = {
    "open-mpi jobs (their segment files in /dev/shm)": (
        "tests/conformance/test_backend.py",
        "tests/integration/test_mpi_backend.py",
        "tests/integration/test_run_under_schedulers.py",
        "tests/integration/test_timeline.py",
    ),
}
_UNIT_OF_FILE = {path: unit for unit, paths in SHARED_UNITS.items() for path in paths}
# Files whose bounds leave a scheduler no more than half a second or so: under xdist they run
# alone. The other worker's load once took a frozen rank's error 0.06 s past its bound. (The
# partition tests' bound leaves 3 s beyond the promise: they share the machine.)
ALONE = (
    "tests/integration/test_fault_matrix.py",
    "tests/integration/test_frozen_rank.py",
    "tests/integration/test_hang_report.py",
    "tests/integration/test_shm_failures.py",
    "tests/integration/test_store_host_death.py",
)
# The lock the workers share (xdist's workers inherit the environment of the controller, which
# imports this file first): held exclusively by an ALONE file, shared by each other test.
_MACHINE_LOCK = os.environ.setdefault("RINGTORCH_TESTS_MACHINE_LOCK",
                                      os.path.join(_secret_dir, "machine.lock"))

_skipped: list[str] = []
# marker -> (node ids deselected, why): the tests whose machine lacks what they need
_deselected: dict[str, tuple[list[str], str]] = {}


class _MachineShare:
    """Under xdist: the worker's hold on the machine lock. Each test of an ordinary file holds
    it shared from its setup to its teardown (module fixtures made or ended with it included);
    an ALONE file holds it exclusively from its first test's setup to its last test's teardown,
    so the other worker waits at most for the test it is running."""

    def __init__(self) -> None:
        self.fd: int | None = None

    def take(self, mode: int) -> None:
        if self.fd is None:
            fd = os.open(_MACHINE_LOCK, os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(fd, mode)
            self.fd = fd

    def give_back(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None


_machine_share = _MachineShare()


def _file_of(nodeid: str) -> str:
    """The test file of a node id: the unit of work under ``--dist loadfile``."""
    return nodeid.split("::", 1)[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not hasattr(item.config, "workerinput"):  # not an xdist worker: nothing to share
        yield
        return
    here = _file_of(item.nodeid)
    alone = here in ALONE
    _machine_share.take(fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    try:
        yield
    finally:
        if not alone or nextitem is None or _file_of(nextitem.nodeid) != here:
            _machine_share.give_back()


def _gpu_count() -> tuple[int, str]:
    """Visible NVIDIA GPUs usable by torch, counted without initialising CUDA."""
    import torch

    from ringtorch.launcher.config import visible_gpu_count

    if not torch.backends.cuda.is_built():
        return 0, f"torch {torch.__version__} is built without CUDA"
    count = visible_gpu_count()
    if count == 0 and "CUDA_VISIBLE_DEVICES" not in os.environ and shutil.which("nvidia-smi"):
        # a container may show neither /proc/driver/nvidia nor /dev/nvidiaN: ask the driver's
        # tool (a process of its own; nothing here touches CUDA)
        import subprocess

        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=30).stdout
        count = sum(1 for line in listed.splitlines() if line.startswith("GPU "))
    return count, f"{count} NVIDIA GPU(s) visible"


def _netns_missing(items: list[pytest.Item]) -> dict[pytest.Item, str]:
    from ringtorch.testing.netns import available, sweep_stale

    ok, reason = available()
    if ok:
        sweep_stale()
        return {}
    return dict.fromkeys(items, reason)


def _gpu_missing(items: list[pytest.Item]) -> dict[pytest.Item, str]:
    count, why = _gpu_count()
    missing = {}
    for item in items:
        marker = item.get_closest_marker("gpu")
        assert marker is not None
        needed = int(marker.args[0]) if marker.args else 1
        if needed > count:
            missing[item] = f"needs {needed} GPU(s); {why}"
    return missing


def _nccl_missing(items: list[pytest.Item]) -> dict[pytest.Item, str]:
    from ringtorch._device import nccl_lib

    try:
        found = nccl_lib.locate()
    except FileNotFoundError as exc:
        return dict.fromkeys(items, str(exc))
    if found is None:
        return dict.fromkeys(items, "no NCCL library (install nvidia-nccl-cu13, or set "
                                    "RINGTORCH_NCCL_LIBRARY)")
    return {}


_NEEDS = {"netns": _netns_missing, "gpu": _gpu_missing, "nccl_lib": _nccl_missing}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker, missing_of in _NEEDS.items():
        needing = [item for item in items if item.get_closest_marker(marker)]
        if not needing:
            continue
        missing = missing_of(needing)
        if not missing:
            continue
        _deselected[marker] = ([item.nodeid for item in missing], next(iter(missing.values())))
        config.hook.pytest_deselected(items=list(missing))
        items[:] = [item for item in items if item not in missing]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:  # an xdist worker: the controller prints the summary
        worker_output["deselected"] = {marker: (list(ids), why)
                                       for marker, (ids, why) in _deselected.items()}
    if _skipped and not os.environ.get("RINGTORCH_ALLOW_SKIPS"):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    for marker, (ids, why) in _deselected.items():
        terminalreporter.write_line(
            f"DESELECTED {len(ids)} test(s) marked {marker}: {why}", yellow=True)
    if _skipped and not os.environ.get("RINGTORCH_ALLOW_SKIPS"):
        terminalreporter.write_line(
            f"FAILED: {len(_skipped)} test(s) were skipped; no test may be skipped here: "
            + ", ".join(_skipped), red=True)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """Under xdist the workers collect and deselect; the controller reports it, once."""
    output = getattr(node, "workeroutput", None) or {}
    for marker, (ids, why) in (output.get("deselected") or {}).items():
        _deselected.setdefault(marker, (list(ids), why))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadfile``: each file is a unit of work, except that the files of one
    SHARED_UNITS entry make one unit together."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedUnitsScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = _file_of(nodeid)
            return _UNIT_OF_FILE.get(path, path)

    return SharedUnitsScheduling(config, log)

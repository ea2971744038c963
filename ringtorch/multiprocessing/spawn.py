"""``spawn`` and ``start_processes``: run ``fn(i, *args)`` on N processes, with torch's semantics.

The first child that fails decides the outcome: the others are stopped (SIGTERM, then SIGKILL
after the grace period) and the parent raises ``ProcessRaisedException`` carrying the child's
traceback, or ``ProcessExitedException`` naming its exit code or signal. A child dies with
its parent (a parent-death SIGINT, swallowed as KeyboardInterrupt, as in torch), and a parent
interrupted while joining stops its children before the interrupt propagates: nothing is
left behind. Tracebacks travel as JSON error files (``ringtorch._workers.errorfile``), never
as pickles.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ringtorch._workers import ProcessFailure, set_parent_death_signal, stop_processes
from ringtorch._workers.errorfile import NOT_AVAILABLE, write_error_file

ENV_VAR_PARALLEL_START = "TORCH_MP_PARALLEL_START"
_DEFAULT_GRACE_S = 30.0

log = logging.getLogger(__name__)


class ProcessException(Exception):
    """A spawned process failed; ``error_index`` is its index, ``error_pid`` its pid."""

    __slots__ = ["error_index", "error_pid"]

    def __init__(self, msg: str, error_index: int, error_pid: int) -> None:
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.error_pid = error_pid

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.msg, self.error_index, self.error_pid)


class ProcessRaisedException(ProcessException):
    """A spawned process raised; the message carries its traceback."""


class ProcessExitedException(ProcessException):
    """A spawned process exited non-zero or was killed by a signal, without a traceback."""

    __slots__ = ["exit_code"]

    def __init__(self, msg: str, error_index: int, error_pid: int, exit_code: int,
                 signal_name: str | None = None) -> None:
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self),
                (self.msg, self.error_index, self.error_pid, self.exit_code, self.signal_name))


def _wrap(fn: Callable[..., Any], i: int, args: tuple[Any, ...], error_file: str,
          parent_pid: int | None) -> None:
    set_parent_death_signal(signal.SIGINT, expected_parent=parent_pid)
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass  # SIGINT from the parent's death or from the terminal: exit quietly
    except Exception as exc:
        write_error_file(error_file, exc, traceback.format_exc())
        sys.last_value = exc  # as for an unhandled exception: exit hooks see that this failed
        sys.exit(1)


class _ChildHandle:
    """A ``multiprocessing.Process`` seen through ``ringtorch._workers.Stoppable``."""

    pgid = None

    def __init__(self, process: Any) -> None:
        self.process = process
        self.pid = int(process.pid)

    def poll(self) -> int | None:
        return self.process.exitcode

    def send(self, sig: int) -> None:
        if self.process.exitcode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


class ProcessContext:
    """The running children of ``start_processes(..., join=False)``; ``join()`` watches them."""

    def __init__(self, processes: list[Any], error_files: list[str]) -> None:
        self.error_files = error_files
        self.processes = processes
        self.sentinels = {process.sentinel: index for index, process in enumerate(processes)}

    def pids(self) -> list[int]:
        """The children's pids, in index order."""
        return [int(process.pid) for process in self.processes]

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the children; True once all exited cleanly.

        When a child fails, the others get ``grace_period`` seconds to finish on their own,
        then SIGTERM, then (after ``grace_period``, default 30 s) SIGKILL.

        Raises:
            ProcessRaisedException: the first failed child raised; its traceback is in the message.
            ProcessExitedException: the first failed child exited non-zero or was killed.
        """
        if not self.sentinels:
            return True
        ready = multiprocessing.connection.wait(list(self.sentinels), timeout=timeout)
        error_index = None
        for sentinel in ready:
            index = self.sentinels.pop(sentinel)
            process = self.processes[index]
            process.join()
            if process.exitcode != 0:
                error_index = index
                break
        if error_index is None:
            done = not self.sentinels
            if done:
                self._remove_error_files()
            return done
        self._stop_others(grace_period)
        raise self._failure(error_index)

    def _stop_others(self, grace_period: float | None) -> None:
        handles = [_ChildHandle(p) for p in self.processes]
        if grace_period is not None:
            deadline = time.monotonic() + grace_period
            while any(h.poll() is None for h in handles) and time.monotonic() < deadline:
                time.sleep(0.02)
        for handle in handles:
            if handle.poll() is None:
                log.warning("Terminating process %s via signal SIGTERM", handle.pid)
        grace = _DEFAULT_GRACE_S if grace_period is None else grace_period
        for pid in stop_processes(handles, signal.SIGTERM, grace):
            log.warning("Unable to shutdown process %s via SIGTERM , forcefully exiting via "
                        "SIGKILL", pid)
        for process in self.processes:
            process.join()
        self.sentinels.clear()

    def _failure(self, index: int) -> ProcessException:
        process = self.processes[index]
        failure = ProcessFailure(local_rank=index, pid=process.pid, exitcode=process.exitcode,
                                 error_file=self.error_files[index])
        self._remove_error_files()
        if failure.error_file != NOT_AVAILABLE:
            msg = f"\n\n-- Process {index:d} terminated with the following error:\n"
            return ProcessRaisedException(msg + failure.traceback(), index, process.pid)
        if process.exitcode < 0:
            name = failure.signal_name()
            if name == NOT_AVAILABLE:
                name = f"<Unknown signal {-process.exitcode}>"
            return ProcessExitedException(
                f"process {index:d} terminated with signal {name}",
                error_index=index, error_pid=process.pid, exit_code=process.exitcode,
                signal_name=name)
        return ProcessExitedException(
            f"process {index:d} terminated with exit code {process.exitcode:d}",
            error_index=index, error_pid=process.pid, exit_code=process.exitcode)

    def _remove_error_files(self) -> None:
        for path in self.error_files:
            try:
                os.unlink(path)
            except OSError:
                pass


class SpawnContext(ProcessContext):
    """Deprecated name of :class:`ProcessContext` (torch renamed it in 1.4)."""

    def __init__(self, processes: list[Any], error_files: list[str]) -> None:
        warnings.warn("SpawnContext is renamed to ProcessContext since 1.4 release.",
                      stacklevel=2)
        super().__init__(processes, error_files)


def _fresh_error_file() -> str:
    fd, path = tempfile.mkstemp(prefix="ringtorch-errorfile-", suffix=".json")
    os.close(fd)
    os.unlink(path)  # the child creates it only when it fails
    return path


def start_processes(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1,
                    join: bool = True, daemon: bool = False,
                    start_method: str = "spawn") -> ProcessContext | None:
    """Start ``nprocs`` processes running ``fn(i, *args)`` with any multiprocessing start method.

    Returns:
        None after all children finished when ``join``; else the :class:`ProcessContext`.

    Raises:
        ProcessRaisedException, ProcessExitedException: see :meth:`ProcessContext.join`.
    """
    mp = multiprocessing.get_context(start_method)
    # A forkserver child's parent is the fork server, not us: do not check the parent pid.
    parent = os.getpid() if start_method in ("spawn", "fork") else None

    def start_one(i: int) -> tuple[Any, str]:
        error_file = _fresh_error_file()
        process = mp.Process(target=_wrap, args=(fn, i, tuple(args), error_file, parent),
                             daemon=daemon)
        process.start()
        return process, error_file

    parallel = (start_method == "forkserver"
                and os.environ.get(ENV_VAR_PARALLEL_START, "0") == "1")
    if parallel:
        with ThreadPoolExecutor(max_workers=nprocs) as pool:
            started = list(pool.map(start_one, range(nprocs)))
    else:
        started = [start_one(i) for i in range(nprocs)]
    context = ProcessContext([p for p, _ in started], [f for _, f in started])
    if not join:
        return context
    try:
        while not context.join():
            pass
    except BaseException as exc:
        if not isinstance(exc, ProcessException):  # an interrupt: stop the children first
            context._stop_others(grace_period=None)
        raise
    return None


def spawn(fn: Callable[..., Any], args: tuple[Any, ...] = (), nprocs: int = 1,
          join: bool = True, daemon: bool = False,
          start_method: str = "spawn") -> ProcessContext | None:
    """Spawn ``nprocs`` processes running ``fn(i, *args)``; torch.multiprocessing.spawn's API.

    ``fn`` must be importable by name (defined at module level). ``start_method`` other than
    "spawn" is deprecated, as in torch: a FutureWarning, and "spawn" is used anyway.
    """
    if start_method != "spawn":
        msg = (f"This method only supports start_method=spawn (got: {start_method}).\n"
               "To use a different start_method use:\n\t\t"
               " torch.multiprocessing.start_processes(...)")
        warnings.warn(msg, FutureWarning, stacklevel=2)
    return start_processes(fn, args, nprocs, join, daemon, start_method="spawn")


__all__ = [
    "ProcessContext",
    "ProcessException",
    "ProcessExitedException",
    "ProcessRaisedException",
    "SpawnContext",
    "spawn",
    "start_processes",
]

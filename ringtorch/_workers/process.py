"""Start worker processes that cannot outlive their supervisor, and stop them all.

Every worker leads its own session and process group (``setsid``), so one ``killpg`` reaches
the worker and every process it started; the parent-death signal (lifeline.py) kills the
worker if the supervisor dies without cleaning up. :func:`stop_processes` is the one
teardown both the launcher and ``spawn`` use: a polite signal to every process (group), a
grace period, then SIGKILL to whatever is left, and every child reaped, so nothing is left
behind, zombies included.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, Protocol

from ringtorch._workers import proctable
from ringtorch._workers.lifeline import death_signal_preexec


class WorkerStartError(OSError):
    """A worker's program could not be started (missing executable, no permission)."""


class Stoppable(Protocol):
    """What teardown needs from a child process."""

    pid: int

    @property
    def pgid(self) -> int | None:
        """The process group this child leads, or None when it shares its parent's."""

    def poll(self) -> int | None:
        """Reap the child if it has exited; its exit code (negative: killed by that signal)."""

    def send(self, sig: int) -> None:
        """Send ``sig`` to the child (to its whole group when it leads one); never raises."""


def open_pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when ``pid`` exits, or None before Linux 5.3 (then
    wait_any polls instead)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class WorkerProcess:
    """One worker program, leading its own process group, armed to die with its supervisor.

    Start it from the supervisor's main thread: the parent-death signal fires when the
    forking *thread* exits.
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], *,
                 stdout: int | IO[Any] | None = None, stderr: int | IO[Any] | None = None,
                 death_signal: int = signal.SIGKILL, cwd: str | None = None) -> None:
        """Start ``argv`` with exactly the environment ``env``.

        Raises:
            WorkerStartError: the program does not exist or cannot be executed.
        """
        try:
            self._popen = subprocess.Popen(
                list(argv), env=dict(env), stdout=stdout, stderr=stderr, cwd=cwd,
                start_new_session=True, preexec_fn=death_signal_preexec(death_signal),
                close_fds=True,
            )
        except OSError as exc:
            raise WorkerStartError(
                exc.errno, f"cannot start worker program {argv[0]!r}: {exc.strerror}") from exc
        self.pid: int = self._popen.pid
        self.argv = list(argv)
        self.exited_at: float | None = None  # time.time() when the exit was first seen
        self._pidfd = open_pidfd(self.pid)

    def fileno(self) -> int | None:
        """A pidfd that becomes readable when the worker exits (None where unsupported)."""
        return self._pidfd

    @property
    def pgid(self) -> int | None:
        """See base class."""
        return self.pid

    def poll(self) -> int | None:
        """See base class."""
        code = self._popen.poll()
        if code is not None and self.exited_at is None:
            self.exited_at = time.time()
            self._close_pidfd()
        return code

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def send(self, sig: int) -> None:
        """See base class."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout: float | None = None) -> int:
        """Block until the worker exits (reaping it); its exit code."""
        return self._popen.wait(timeout)

    def pipes(self) -> tuple[IO[bytes] | None, IO[bytes] | None]:
        """The read ends of the worker's stdout and stderr pipes (None where not piped)."""
        return self._popen.stdout, self._popen.stderr


def wait_any(procs: Sequence[WorkerProcess], timeout: float) -> None:
    """Return as soon as one of the running ``procs`` exits, or after ``timeout`` seconds.

    With pidfds the wake-up is immediate, so exit times (``exited_at``) are exact to the
    millisecond and the first failure of a job can be told from the failures it caused.
    """
    fds = [p.fileno() for p in procs if p.poll() is None]
    if not fds:
        return
    if any(fd is None for fd in fds):
        time.sleep(timeout)
        return
    select.select(fds, [], [], timeout)
    for proc in procs:
        proc.poll()


def _survivors(procs: Sequence[Stoppable]) -> list[int]:
    """Pids of the children and group members that are still alive (reaping as it goes)."""
    alive = [p.pid for p in procs if p.poll() is None]
    groups = {p.pgid for p in procs if p.pgid is not None}
    if groups:
        alive += [e.pid for e in proctable.live_members(groups) if e.pid not in alive]
    return alive


def wait_gone(procs: Sequence[Stoppable], deadline: float,
              force: Callable[[], bool] = lambda: False, poll_s: float = 0.02) -> list[int]:
    """Wait until every child and member of their groups is gone, the deadline passes or
    ``force()`` turns true; the pids still alive (empty when all are gone)."""
    while True:
        alive = _survivors(procs)
        if not alive or time.monotonic() >= deadline or force():
            return alive
        time.sleep(poll_s)


def stop_processes(procs: Sequence[Stoppable], sig: int = signal.SIGTERM, grace_s: float = 30.0,
                   force: Callable[[], bool] = lambda: False) -> list[int]:
    """Stop every process in ``procs`` and the groups they lead; return when all are gone.

    ``sig`` goes to every process (group) at once, even to exited leaders whose group may
    still hold their children, and SIGCONT after it, as a shell does for a stopped job: a
    process stopped by SIGSTOP (or a debugger's detach gone wrong) acts on ``sig`` only once
    it runs again, and would otherwise hold the job for the whole grace. After ``grace_s``
    seconds, or as soon as ``force()`` is true (a second Ctrl-C), SIGKILL goes to whatever
    is left. Every child is reaped.

    Returns:
        The pids that had to be killed with SIGKILL.
    """
    if sig != signal.SIGKILL:
        for proc in procs:
            proc.send(sig)
            proc.send(signal.SIGCONT)
        stubborn = wait_gone(procs, time.monotonic() + grace_s, force)
    else:
        stubborn = _survivors(procs)
    for proc in procs:
        proc.send(signal.SIGKILL)
    # SIGKILL cannot be caught; this only waits for the kernel to finish the deaths.
    wait_gone(procs, time.monotonic() + 10.0)
    return stubborn


def reap_adopted(spare: set[int]) -> list[int]:
    """Kill and reap the orphans this (subreaper) process adopted: its children not in ``spare``.

    Returns:
        The pids found and killed.
    """
    found = [e.pid for e in proctable.children_of(os.getpid()) if e.pid not in spare]
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in found:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return found


def describe_exit(code: int) -> str:
    """``"exit code 3"`` or ``"signal SIGKILL"`` for a Popen-style exit code."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


__all__ = [
    "Stoppable",
    "WorkerProcess",
    "WorkerStartError",
    "describe_exit",
    "reap_adopted",
    "stop_processes",
    "wait_any",
    "wait_gone",
]

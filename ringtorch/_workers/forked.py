"""A worker forked from its supervisor to run a Python callable (``start_method="fork"``).

Notebook launchers start workers from an interactive session whose functions cannot be sent
to a fresh interpreter; torch forks for them, and so does this. The child leads its own
session and process group and carries the parent-death signal, like every worker
(process.py); it gets exactly the environment it is given, the standard streams it is given,
the default signal handlers, runs ``target()`` and leaves with ``os._exit`` (no atexit
handler or finalizer of the parent runs twice). An exception ending ``target`` is printed
and exits 1; ``target`` records it in the error file itself (``record``).

Forking copies a process whose other threads are frozen wherever they were: as with torch's
fork start method, the callable must not need a lock another thread held (and CUDA must not
have been initialised in the parent).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import IO, Any

from ringtorch._workers.lifeline import set_parent_death_signal
from ringtorch._workers.process import open_pidfd

_DEFAULT_HANDLERS = {signal.SIGTERM: signal.SIG_DFL, signal.SIGHUP: signal.SIG_DFL,
                     signal.SIGQUIT: signal.SIG_DFL, signal.SIGINT: signal.default_int_handler}


def _child_fd(target: int | IO[Any] | None, default: int) -> tuple[int, int | None, bool]:
    """(fd the child's stream becomes, read end the parent keeps or None, whether the fd was
    opened here and the parent must close it after the fork)."""
    if target is None:
        return default, None, False
    if target == subprocess.PIPE:
        read_end, write_end = os.pipe()
        return write_end, read_end, True
    if target == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_WRONLY), None, True
    if isinstance(target, int):
        return target, None, False
    return target.fileno(), None, False


class ForkedWorker:
    """One forked worker; the same interface as ``WorkerProcess`` (pid, poll, send, ...)."""

    def __init__(self, target: Callable[[], Any], env: Mapping[str, str], *,
                 stdout: int | IO[Any] | None = None, stderr: int | IO[Any] | None = None,
                 death_signal: int = signal.SIGKILL) -> None:
        """Fork and run ``target()`` in the child with exactly the environment ``env``."""
        out_fd, out_read, out_owned = _child_fd(stdout, 1)
        err_fd, err_read, err_owned = _child_fd(stderr, 2)
        parent = os.getpid()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child would print the parent's buffered output again
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _run_child(target, env, out_fd, err_fd, death_signal, parent)
        for fd, owned in ((out_fd, out_owned), (err_fd, err_owned)):
            if owned:  # the child has its copy; the parent's would keep the pipe from EOF
                os.close(fd)
        self.pid = pid
        self.argv = [getattr(target, "__qualname__", repr(target))]
        self.exited_at: float | None = None
        self._code: int | None = None
        self.stdout = os.fdopen(out_read, "rb", buffering=0) if out_read is not None else None
        self.stderr = os.fdopen(err_read, "rb", buffering=0) if err_read is not None else None
        self._pidfd = open_pidfd(pid)

    def fileno(self) -> int | None:
        """A pidfd that becomes readable when the worker exits (None where unsupported)."""
        return self._pidfd

    @property
    def pgid(self) -> int | None:
        """The process group the worker leads (its own pid)."""
        return self.pid

    def poll(self) -> int | None:
        """Reap the worker if it has exited; its exit code (negative: killed by that signal)."""
        if self._code is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self._code
            if pid == 0:
                return None
            self._code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else \
                os.WEXITSTATUS(status)
            self.exited_at = time.time()
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
        return self._code

    def send(self, sig: int) -> None:
        """Send ``sig`` to the worker's process group; never raises."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout: float | None = None) -> int:
        """Block until the worker exits (reaping it); its exit code.

        Raises:
            subprocess.TimeoutExpired: it still runs after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.argv, timeout or 0.0)
            if self._pidfd is not None:
                select.select([self._pidfd], [], [], left)
            else:
                time.sleep(0.01)
        return code

    def pipes(self) -> tuple[IO[bytes] | None, IO[bytes] | None]:
        """The read ends of the worker's stdout and stderr pipes (None where not piped)."""
        return self.stdout, self.stderr


def _run_child(target: Callable[[], Any], env: Mapping[str, str], out_fd: int, err_fd: int,
               death_signal: int, parent: int) -> None:
    code = 1
    try:
        os.setsid()
        set_parent_death_signal(death_signal, expected_parent=parent)
        for sig, handler in _DEFAULT_HANDLERS.items():
            signal.signal(sig, handler)
        if out_fd != 1:
            os.dup2(out_fd, 1)
        if err_fd != 2:
            os.dup2(err_fd, 2)
        os.environ.clear()
        os.environ.update(env)
        target()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


__all__ = ["ForkedWorker"]

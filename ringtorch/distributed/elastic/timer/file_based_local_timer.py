"""``FileTimerServer`` and ``FileTimerClient``: timers over a named pipe, from any process.

Wire format (torch's, so either side interoperates with torch's): one JSON object per line,
``{"version": 1, "pid": P, "scope_id": S, "expiration_time": T, "signal": N}``, each written
by one ``write`` of at most ``PIPE_BUF`` bytes (atomic on a pipe, so lines of concurrent
clients never interleave); ``expiration_time`` < 0 releases. The client opens the pipe
without blocking, so a missing server is an error, not a hang.

Rule kept: when timers expire, the server sends each expired worker the signal of its
earliest expired timer that has one (> 0; none: it is left alone), then, if it killed any
worker, sends the same signal to its own process, as torch's server does (it runs in the
agent, whose death the job notices).
"""

from __future__ import annotations

import json
import os
import select
import signal as signals
import threading
import time
from collections.abc import Callable
from typing import Any

from ringtorch.distributed.elastic.timer.api import TimerClient, TimerRequest, TimerTable
from ringtorch.distributed.elastic.timer.debug_info_logging import (
    log_debug_info_for_expired_timers,
)
from ringtorch.distributed.elastic.utils.logging import get_logger

_OPEN_TRIES = 10  # the client's tries to open the pipe (the server may still be starting)
_OPEN_RETRY_S = 0.1


class FileTimerRequest(TimerRequest):
    """A ``TimerRequest`` with the ``signal`` that reaps the worker (0: do not reap)."""

    __slots__ = ["signal", "version"]

    def __init__(self, worker_pid: int, scope_id: str, expiration_time: float,
                 signal: int = 0) -> None:
        super().__init__(worker_id=worker_pid, scope_id=scope_id,
                         expiration_time=expiration_time)
        self.version = 1
        self.signal = signal

    @property
    def worker_pid(self) -> int:
        return int(self.worker_id)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FileTimerRequest):
            return (super().__eq__(other) and self.version == other.version
                    and self.signal == other.signal)
        return False

    __hash__ = None  # type: ignore[assignment]

    def to_json(self) -> str:
        return json.dumps({"version": self.version, "pid": self.worker_pid,
                           "scope_id": self.scope_id, "expiration_time": self.expiration_time,
                           "signal": self.signal})


class FileTimerClient(TimerClient):
    """A client of the ``FileTimerServer`` whose pipe is ``file_path``, on the same host;
    the worker is named by its pid. ``signal`` kills it on expiry (<= 0: it is not killed).

    Raises (from ``acquire``/``release``):
        BrokenPipeError: no server reads the pipe (after 10 tries, 0.1 s apart).
        RuntimeError: the request is longer than ``select.PIPE_BUF`` bytes.
    """

    def __init__(self, file_path: str, signal: int = signals.SIGKILL) -> None:
        super().__init__()
        self._file_path = file_path
        self.signal = signal

    def _open_non_blocking(self) -> Any:
        # Non-blocking: with no reader (server down or not yet up) open fails at once (ENXIO)
        # instead of waiting for one.
        for attempt in range(_OPEN_TRIES):
            try:
                fd = os.open(self._file_path, os.O_WRONLY | os.O_NONBLOCK)
                return os.fdopen(fd, "wt")
            except Exception:
                get_logger(__name__).exception("Error running %s. Retrying...",
                                               "_open_non_blocking")
                if attempt == _OPEN_TRIES - 1:
                    raise
                time.sleep(_OPEN_RETRY_S)
        raise AssertionError("unreachable")

    def _send_request(self, request: FileTimerRequest) -> None:
        try:
            file = self._open_non_blocking()
        except Exception as exc:
            raise BrokenPipeError("Could not send the FileTimerRequest because "
                                  "FileTimerServer is not available.") from exc
        with file:
            line = request.to_json()
            if len(line) > select.PIPE_BUF:  # longer writes may interleave with others'
                raise RuntimeError(f"FileTimerRequest larger than {select.PIPE_BUF} bytes is "
                                   f"not supported: {line}")
            file.write(line + "\n")

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """See base class."""
        self._send_request(FileTimerRequest(os.getpid(), scope_id, expiration_time,
                                            self.signal))

    def release(self, scope_id: str) -> None:
        """See base class."""
        self._send_request(FileTimerRequest(os.getpid(), scope_id, -1, 0))


class FileTimerServer:
    """The server of ``FileTimerClient``s on this host: creates the pipe ``file_path`` (replacing
    any file there), and from ``start`` on reads requests and reaps expired workers in a
    watchdog thread that looks at the timers at least every ``max_interval`` seconds.
    ``log_event(name, request)`` hears "watchdog started", "watchdog stopped", "timer expired"
    and "kill worker process"."""

    def __init__(self, file_path: str, run_id: str, max_interval: float = 10,
                 daemon: bool = True,
                 log_event: Callable[[str, FileTimerRequest | None], None] | None = None
                 ) -> None:
        self._file_path = file_path
        self._run_id = run_id
        self._max_interval = max_interval
        self._daemon = daemon
        self._table: TimerTable[FileTimerRequest] = TimerTable()
        self._timers = self._table.timers  # torch's attribute name
        self._stop_signaled = False
        self._watchdog_thread: threading.Thread | None = None
        self._is_client_started = False
        if os.path.exists(file_path):
            os.remove(file_path)
        os.mkfifo(file_path)
        self._request_count = 0  # requests registered (torch's tests read it)
        self._run_once = False
        self._log_event = log_event or (lambda name, request: None)
        self._last_progress_time = int(time.time())
        self._log = get_logger(__name__)

    def start(self) -> None:
        """Start the watchdog thread; returns at once."""
        self._log.info("Starting %s... max_interval=%s, daemon=%s, file_path=%s",
                       type(self).__name__, self._max_interval, self._daemon, self._file_path)
        self._watchdog_thread = threading.Thread(target=self._watchdog_loop, daemon=self._daemon)
        self._log.info("Starting watchdog thread...")
        self._watchdog_thread.start()
        self._log_event("watchdog started", None)

    def stop(self) -> None:
        """Stop the watchdog (waiting ``max_interval`` seconds at most) and remove the pipe."""
        self._log.info("Stopping %s", type(self).__name__)
        self._stop_signaled = True
        if self._watchdog_thread:
            self._log.info("Stopping watchdog thread...")
            self._watchdog_thread.join(self._max_interval)
            self._watchdog_thread = None
        else:
            self._log.info("No watchdog thread running, doing nothing")
        if os.path.exists(self._file_path):
            os.remove(self._file_path)
        self._log_event("watchdog stopped", None)

    def run_once(self) -> None:
        """Process the requests already written, once, then stop and remove the pipe."""
        self._run_once = True
        if self._watchdog_thread:
            self._log.info("Stopping watchdog thread...")
            self._watchdog_thread.join()
            self._watchdog_thread = None
        else:
            self._log.info("No watchdog thread running, doing nothing")
        if os.path.exists(self._file_path):
            os.remove(self._file_path)

    @staticmethod
    def is_process_running(pid: int) -> bool:
        """True while a process ``pid`` exists that this process may signal."""
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False

    def _watchdog_loop(self) -> None:
        # Read and write: the server holds a writer itself, so the pipe never reads as
        # closed between clients and select() can wait on it; clients can open it from now on.
        try:
            fd = os.open(self._file_path, os.O_RDWR | os.O_NONBLOCK)
        except Exception:
            self._log.exception("Could not open the FileTimerServer pipe")
            raise
        pending = bytearray()
        try:
            while not self._stop_signaled:
                try:
                    run_once = self._run_once
                    self._run_watchdog(fd, pending)
                    if run_once:
                        break
                    self._last_progress_time = int(time.time())
                except Exception:
                    self._log.exception("Error running watchdog")
        finally:
            os.close(fd)

    def _get_requests(self, fd: int, pending: bytearray) -> list[FileTimerRequest]:
        """The requests that arrive within ``max_interval`` seconds (all those already there
        when running once): returns as soon as some arrived and the pipe is drained."""
        deadline = time.monotonic() + self._max_interval
        requests: list[FileTimerRequest] = []
        while not self._stop_signaled or self._run_once:
            wait = 0.0 if (requests or self._run_once) else deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(wait, 0.0))
            if not ready:
                break
            pending += os.read(fd, 65536)
            *lines, rest = pending.split(b"\n")
            pending[:] = rest
            for line in lines:
                request = json.loads(line)
                requests.append(FileTimerRequest(
                    worker_pid=request["pid"], scope_id=request["scope_id"],
                    expiration_time=request["expiration_time"], signal=request["signal"]))
        if requests:
            self._is_client_started = True
        return requests

    def _run_watchdog(self, fd: int, pending: bytearray) -> None:
        self.register_timers(self._get_requests(fd, pending))
        all_expired = self.get_expired_timers(time.time())
        log_debug_info_for_expired_timers(
            self._run_id, {pid: [timer.to_json() for timer in timers]
                           for pid, timers in all_expired.items()})
        reaped: set[int] = set()
        reap_signal = 0
        for pid, timers in all_expired.items():
            self._log.info("Reaping worker_pid=[%s]. Expired timers: %s", pid,
                           [timer.scope_id for timer in timers])
            reaped.add(pid)
            chosen = self._first_with_signal(sorted(timers, key=lambda t: t.expiration_time))
            if chosen is None:
                self._log.info("No signal specified with worker=[%s]. Do not reap it.", pid)
                continue
            if self._reap_worker(pid, chosen.signal):
                self._log.info("Successfully reaped worker=[%s] with signal=%s", pid,
                               chosen.signal)
                self._log_event("kill worker process", chosen)
                reap_signal = chosen.signal
            else:
                self._log.error("Error reaping worker=[%s]. Will retry on next watchdog.", pid)
        if reap_signal > 0:
            self._log.info("Terminating the server process=[%s] because of expired timers",
                           os.getpid())
            self._reap_worker(os.getpid(), reap_signal)
        self.clear_timers(reaped)

    def _first_with_signal(self, timers: list[FileTimerRequest]) -> FileTimerRequest | None:
        """The first of ``timers`` with a signal; each timer looked at is reported expired."""
        for timer in timers:
            self._log_event("timer expired", timer)
            if timer.signal > 0:
                return timer
        return None

    def register_timers(self, timer_requests: list[FileTimerRequest]) -> None:
        """Apply acquire and release (negative ``expiration_time``) requests."""
        self._request_count += len(timer_requests)
        self._table.register(timer_requests)

    def clear_timers(self, worker_pids: set[int]) -> None:
        """Drop the timers of ``worker_pids`` and of every worker that no longer runs."""
        gone = {pid for pid, _ in self._timers if not self.is_process_running(pid)}
        self._table.clear(set(worker_pids) | gone)

    def get_expired_timers(self, deadline: float) -> dict[int, list[FileTimerRequest]]:
        """worker pid -> its timers with ``expiration_time <= deadline``."""
        return self._table.expired(deadline)

    def _reap_worker(self, worker_pid: int, signal: int) -> bool:
        try:
            os.kill(worker_pid, signal)
            return True
        except ProcessLookupError:
            self._log.info("Process with pid=%s does not exist. Skipping", worker_pid)
            return True
        except Exception:
            self._log.exception("Error terminating pid=%s", worker_pid)
        return False

    def get_last_progress_time(self) -> int:
        """When the watchdog last finished a pass (``time.time()`` seconds, whole)."""
        return self._last_progress_time if self._is_client_started else int(time.time())


__all__ = ["FileTimerClient", "FileTimerRequest", "FileTimerServer"]

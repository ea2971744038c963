"""``LocalTimerServer`` and ``LocalTimerClient``: timers over a ``multiprocessing`` queue.

Rule kept: the server runs in the process that started the workers (it holds the queue's
reading end); workers are named by their pid, and a worker whose timer expired gets SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from queue import Empty
from typing import Any

from ringtorch.distributed.elastic.timer.api import (
    RequestQueue,
    TimerClient,
    TimerRequest,
    TimerServer,
    TimerTable,
)

log = logging.getLogger(__name__)


class LocalTimerClient(TimerClient):
    """A worker's client of a ``LocalTimerServer`` on the same host: puts its requests, named
    by its pid, on the server's ``multiprocessing`` queue."""

    def __init__(self, mp_queue: Any) -> None:
        super().__init__()
        self._mp_queue = mp_queue

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """See base class."""
        self._mp_queue.put(TimerRequest(os.getpid(), scope_id, expiration_time))

    def release(self, scope_id: str) -> None:
        """See base class."""
        self._mp_queue.put(TimerRequest(os.getpid(), scope_id, -1))


class MultiprocessingRequestQueue(RequestQueue):
    """A ``RequestQueue`` over a ``multiprocessing.Queue``."""

    def __init__(self, mp_queue: Any) -> None:
        super().__init__()
        self._mp_queue = mp_queue

    def size(self) -> int:
        """See base class."""
        return int(self._mp_queue.qsize())

    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """See base class: the whole call waits ``timeout`` seconds at most."""
        requests: list[TimerRequest] = []
        deadline = time.monotonic() + timeout
        for _ in range(size):
            try:
                requests.append(self._mp_queue.get(
                    block=True, timeout=max(deadline - time.monotonic(), 0.0)))
            except Empty:
                break
            if time.monotonic() >= deadline:
                break
        return requests


class LocalTimerServer(TimerServer):
    """The server of ``LocalTimerClient``s: the workers are this process's children on this
    host; each host of a job runs its own server for its own workers."""

    def __init__(self, mp_queue: Any, max_interval: float = 60, daemon: bool = True) -> None:
        super().__init__(MultiprocessingRequestQueue(mp_queue), max_interval, daemon)
        self._table: TimerTable[TimerRequest] = TimerTable()
        self._timers = self._table.timers  # torch's attribute name, for code that reads it

    def register_timers(self, timer_requests: list[TimerRequest]) -> None:
        """See base class."""
        self._table.register(timer_requests)

    def clear_timers(self, worker_ids: set[Any]) -> None:
        """See base class."""
        self._table.clear(worker_ids)

    def get_expired_timers(self, deadline: float) -> dict[Any, list[TimerRequest]]:
        """See base class."""
        return self._table.expired(deadline)

    def _reap_worker(self, worker_id: int) -> bool:
        try:
            os.kill(worker_id, signal.SIGKILL)
            return True
        except ProcessLookupError:
            log.info("Process with pid=%s does not exist. Skipping", worker_id)
            return True
        except Exception:
            log.exception("Error terminating pid=%s", worker_id)
        return False


__all__ = ["LocalTimerClient", "LocalTimerServer", "MultiprocessingRequestQueue"]

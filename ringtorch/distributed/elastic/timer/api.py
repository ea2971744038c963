"""The timer interfaces (``TimerRequest``, ``TimerClient``, ``RequestQueue``, ``TimerServer``),
``configure`` and ``expires``, with torch's names, messages and semantics.

Rules kept: a request with a negative ``expiration_time`` releases the timer of its
(worker, scope); an acquire replaces any timer of the same (worker, scope). A timer expires
when its ``expiration_time`` (``time.time()`` seconds) is at or before the server's look at
the clock; the server reaps each worker with an expired timer once, then drops all of that
worker's timers. Deciding which timers expired is the pure ``TimerTable``; servers only move
requests and send signals.
"""

from __future__ import annotations

import abc
import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

_R = TypeVar("_R", bound="TimerRequest")


class TimerRequest:
    """One acquire or release of a countdown timer, from a ``TimerClient`` to a ``TimerServer``.

    A negative ``expiration_time`` is a release. ``worker_id`` is whatever the client and
    server use to name a worker (a pid for the local and file-based timers).
    """

    __slots__ = ["expiration_time", "scope_id", "worker_id"]

    def __init__(self, worker_id: Any, scope_id: str, expiration_time: float) -> None:
        self.worker_id = worker_id
        self.scope_id = scope_id
        self.expiration_time = expiration_time

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TimerRequest):
            return (self.worker_id == other.worker_id and self.scope_id == other.scope_id
                    and self.expiration_time == other.expiration_time)
        return False

    __hash__ = None  # type: ignore[assignment]  # mutable and compared by value, as torch's


class TimerTable(Generic[_R]):
    """The live timers of a server, keyed by (worker, scope): the pure part of every server."""

    def __init__(self) -> None:
        self.timers: dict[tuple[Any, str], _R] = {}

    def register(self, requests: Iterable[_R]) -> None:
        """Apply acquires (replace) and releases (negative expiration: remove) in order."""
        for request in requests:
            key = (request.worker_id, request.scope_id)
            if request.expiration_time < 0:
                self.timers.pop(key, None)
            else:
                self.timers[key] = request

    def expired(self, deadline: float) -> dict[Any, list[_R]]:
        """worker -> its timers whose expiration time is at or before ``deadline``."""
        found: dict[Any, list[_R]] = {}
        for request in self.timers.values():
            if request.expiration_time <= deadline:
                found.setdefault(request.worker_id, []).append(request)
        return found

    def clear(self, worker_ids: set[Any]) -> None:
        """Drop every timer of ``worker_ids``."""
        for key in [key for key in self.timers if key[0] in worker_ids]:
            del self.timers[key]


class TimerClient(abc.ABC):
    """A worker's side: acquires and releases its countdown timers at a ``TimerServer``."""

    @abc.abstractmethod
    def acquire(self, scope_id: str, expiration_time: float) -> None:
        """Register a timer of this worker for ``scope_id`` expiring at ``expiration_time``
        (``time.time()`` seconds)."""

    @abc.abstractmethod
    def release(self, scope_id: str) -> None:
        """End the timer of this worker for ``scope_id``; it no longer expires."""


class RequestQueue(abc.ABC):
    """The server's side of the channel that carries timer requests.

    ``size()`` never decreases until ``get`` is called: ``get(size(), timeout=0)`` returns
    that many requests.
    """

    @abc.abstractmethod
    def size(self) -> int:
        """The number of requests waiting now."""

    @abc.abstractmethod
    def get(self, size: int, timeout: float) -> list[TimerRequest]:
        """Up to ``size`` requests, waiting at most ``timeout`` seconds for them."""


class TimerServer(abc.ABC):
    """Watches the timers of the workers on this host and reaps the workers whose timers
    expired, from a watchdog thread (``start``/``stop``) that takes requests from
    ``request_queue`` at least every ``max_interval`` seconds."""

    def __init__(self, request_queue: RequestQueue, max_interval: float,
                 daemon: bool = True) -> None:
        super().__init__()
        self._request_queue = request_queue
        self._max_interval = max_interval
        self._daemon = daemon
        self._watchdog_thread: threading.Thread | None = None
        self._stop_signaled = False

    @abc.abstractmethod
    def register_timers(self, timer_requests: list[TimerRequest]) -> None:
        """Apply acquire and release (negative ``expiration_time``) requests."""

    @abc.abstractmethod
    def clear_timers(self, worker_ids: set[Any]) -> None:
        """Drop every timer of ``worker_ids``."""

    @abc.abstractmethod
    def get_expired_timers(self, deadline: float) -> dict[Any, list[TimerRequest]]:
        """worker_id -> its timers with ``expiration_time <= deadline``."""

    @abc.abstractmethod
    def _reap_worker(self, worker_id: Any) -> bool:
        """Reap the worker: True when done; an exception counts as reaped too."""

    def _reap_worker_no_throw(self, worker_id: Any) -> bool:
        try:
            return self._reap_worker(worker_id)
        except Exception:
            log.exception("Uncaught exception thrown from _reap_worker(), check that the "
                          "implementation correctly catches exceptions")
            return True

    def _watchdog_loop(self) -> None:
        while not self._stop_signaled:
            try:
                self._run_watchdog()
            except Exception:
                log.exception("Error running watchdog")

    def _run_watchdog(self) -> None:
        batch_size = max(1, self._request_queue.size())
        self.register_timers(self._request_queue.get(batch_size, self._max_interval))
        reaped: set[Any] = set()
        for worker_id, timers in self.get_expired_timers(time.time()).items():
            log.info("Reaping worker_id=[%s]. Expired timers: %s", worker_id,
                     self._get_scopes(timers))
            if self._reap_worker_no_throw(worker_id):
                log.info("Successfully reaped worker=[%s]", worker_id)
                reaped.add(worker_id)
            else:
                log.error("Error reaping worker=[%s]. Will retry on next watchdog.", worker_id)
        self.clear_timers(reaped)

    def _get_scopes(self, timer_requests: list[TimerRequest]) -> list[str]:
        return [request.scope_id for request in timer_requests]

    def start(self) -> None:
        """Start the watchdog thread; returns at once."""
        log.info("Starting %s... max_interval=%s, daemon=%s", type(self).__name__,
                 self._max_interval, self._daemon)
        self._watchdog_thread = threading.Thread(target=self._watchdog_loop,
                                                 daemon=self._daemon)
        log.info("Starting watchdog thread...")
        self._watchdog_thread.start()

    def stop(self) -> None:
        """Ask the watchdog thread to stop; waits for it at most ``max_interval`` seconds."""
        log.info("Stopping %s", type(self).__name__)
        self._stop_signaled = True
        if self._watchdog_thread:
            log.info("Stopping watchdog thread...")
            self._watchdog_thread.join(self._max_interval)
            self._watchdog_thread = None
        else:
            log.info("No watchdog thread running, doing nothing")


@dataclass
class _TimerState:
    """All process-global state of the timer package: the client ``expires`` uses."""

    client: TimerClient | None = None


_state = _TimerState()


def configure(timer_client: TimerClient) -> None:
    """Set the client ``expires`` uses when it is given none. Call it before ``expires``."""
    _state.client = timer_client
    log.info("Timer client configured to: %s", type(timer_client).__name__)


@contextmanager
def expires(after: float, scope: str | None = None,
            client: TimerClient | None = None) -> Iterator[None]:
    """Acquire a countdown timer that expires ``after`` seconds from now, released when the
    block ends (normally or by an exception). Once it has expired the worker may be reaped at
    the server's next look (within its ``max_interval``), not at the exact instant.

    ``scope`` names the timer; by default the caller's file and line (``path#line``). torch's
    default names contextlib's own line instead, so there all unnamed timers of a worker share
    one scope; name scopes explicitly where a program relies on either.

    Raises:
        RuntimeError: no ``client`` was given and ``configure`` was not called.
    """
    if client is None:
        if _state.client is None:
            raise RuntimeError("Configure timer client before using countdown timers.")
        client = _state.client
    if scope is None:
        # frames: this generator, contextlib's __enter__, the with statement
        caller = sys._getframe(2)
        scope = f"{caller.f_code.co_filename}#{caller.f_lineno}"
    client.acquire(scope, time.time() + after)
    try:
        yield
    finally:
        client.release(scope)


__all__ = ["RequestQueue", "TimerClient", "TimerRequest", "TimerServer", "configure", "expires"]

"""The RPC agent's threads: a bounded worker pool and a cache of spare threads.

Both use daemon threads, unlike ``concurrent.futures`` (whose threads are joined at exit): a
program that forgets ``rpc.shutdown()`` must still be able to exit, with its connection
readers blocked in ``recv``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

_STOP = object()


class WorkerPool:
    """``size`` threads taking jobs from one queue, in order; started on first use."""

    def __init__(self, size: int, name: str) -> None:
        self.size = size
        self._name = name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Queue ``fn(*args)``; it runs as soon as one of the pool's threads is free."""
        if len(self._threads) < self.size:
            self._start_all()
        self._jobs.put((fn, args))

    def _start_all(self) -> None:
        with self._lock:
            while len(self._threads) < self.size:
                thread = threading.Thread(target=self._loop, daemon=True,
                                          name=f"{self._name}-{len(self._threads)}")
                thread.start()
                self._threads.append(thread)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            fn, args = job
            fn(*args)

    def stop(self) -> None:
        """Let every thread finish its current job and exit (without waiting for them)."""
        with self._lock:
            threads, self._threads = self._threads, []
        for _ in threads:
            self._jobs.put(_STOP)


class _Spare:
    __slots__ = ("job", "wake")

    def __init__(self) -> None:
        self.job: tuple[Callable[..., None], tuple[Any, ...]] | None = None
        self.wake = threading.Lock()
        self.wake.acquire()


class ThreadCache:
    """Run each job at once on its own thread, reusing parked threads.

    Used for jobs that may run for a long time (a connection's reader loop), so that a job
    never waits behind another; a thread parks for ``idle_s`` after its job before exiting.
    """

    def __init__(self, name: str, max_parked: int = 8, idle_s: float = 30.0) -> None:
        self._name = name
        self._max_parked = max_parked
        self._idle_s = idle_s
        self._parked: list[_Spare] = []
        self._lock = threading.Lock()
        self._count = 0

    def spawn(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` now, on a parked thread if there is one."""
        with self._lock:
            spare = self._parked.pop() if self._parked else None
            self._count += 1
            number = self._count
        if spare is not None:
            spare.job = (fn, args)
            spare.wake.release()
            return
        threading.Thread(target=self._loop, args=((fn, args),), daemon=True,
                         name=f"{self._name}-{number}").start()

    def _loop(self, job: tuple[Callable[..., None], tuple[Any, ...]] | None) -> None:
        while job is not None:
            fn, args = job
            fn(*args)
            job = self._park()

    def _park(self) -> tuple[Callable[..., None], tuple[Any, ...]] | None:
        spare = _Spare()
        with self._lock:
            if len(self._parked) >= self._max_parked:
                return None
            self._parked.append(spare)
        if not spare.wake.acquire(timeout=self._idle_s):
            with self._lock:
                if spare in self._parked:
                    self._parked.remove(spare)
                    return None
            spare.wake.acquire()  # popped just now: the job is on its way
        return spare.job

"""Lanes: FIFO queues of Work, each run one item at a time, in order.

A group's collectives go down one lane whose communication thread takes them in order (the
design seed 002 describes for ProcessGroupMPI). A thread hand-off costs two wake-ups
(25-60 us each on these machines), so a *synchronous* operation submitted to an idle lane
runs right away on the caller's thread instead: nothing is queued ahead of it and nothing
can start behind it until it is done, so the order is the same as if the thread had run it.

Point-to-point operations use one lane per (direction, peer, tag): sends to one peer with
one tag stay in order (torch's matching rule), while a receive that waits for its message
never holds up a send or a receive on another lane. Their lanes borrow threads from a small
pool instead of owning one, since a program may use many peers and tags.

The rule: at most one Work of a lane runs at any time, and Works start in submission order.
A Work's completion callbacks (``get_future().then(...)``) run on the thread that ran it, while
the lane still counts it as running; a callback that queues another Work on the same lane and
waits for it (torch's comm hooks do) would wait for itself, so that wait runs the lane's queued
Works, in order, on the waiting thread instead (``help_until``).
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ringtorch._errors import DistBackendError
from ringtorch.collectives.work import Work

log = logging.getLogger(__name__)

_POOL_IDLE_S = 10.0


class WorkerPool:
    """Threads that run lane drains; idle threads exit after a while."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._count = 0

    def run(self, task: Callable[[], None]) -> None:
        """Run ``task`` on an idle thread of the pool, or on a new one."""
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                self._tasks.put(task)
                return
            self._count += 1
            number = self._count
        thread = threading.Thread(target=self._worker, args=(task,),
                                  name=f"{self._name}-p2p-{number}", daemon=True)
        thread.start()

    def _worker(self, task: Callable[[], None] | None) -> None:
        while task is not None:
            task()
            with self._lock:
                self._idle += 1
            try:
                task = self._tasks.get(timeout=_POOL_IDLE_S)
            except queue.Empty:
                with self._lock:
                    # A task may have been handed to us between the timeout and the lock.
                    try:
                        task = self._tasks.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        return


@dataclass(frozen=True)
class LaneStatistics:
    """A snapshot of a Lane, for tests and diagnostics (trio's ``statistics()``).

    Attributes:
        queued: Works waiting in the queue.
        running: a Work of the lane runs now (on the caller's thread or the lane's), or a
            pooled lane's drain is about to run.
        submitted: Works submitted since the lane was made.
        completed: Works that finished running (successfully or not).
        ran_inline: Works that ran on the submitting thread (the lane was idle).
        closed: the lane refuses new Work.
    """

    queued: int
    running: bool
    submitted: int
    completed: int
    ran_inline: int
    closed: bool


class Lane:
    """A FIFO of Work run one at a time (see the module docstring).

    Args:
        name: for thread names and messages.
        pool: borrow threads from this pool; None gives the lane its own thread (started on
            first use), as a group's collective lane has.
    """

    def __init__(self, name: str, pool: WorkerPool | None = None) -> None:
        self.name = name
        self._pool = pool
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: collections.deque[Work] = collections.deque()
        self._busy = False
        self._closed: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._owner: int | None = None  # ident of the thread running one of our Works
        self.next_seq = 0
        self._submitted = 0
        self._completed = 0
        self._ran_inline = 0

    def statistics(self) -> LaneStatistics:
        """A consistent snapshot of the lane (see LaneStatistics)."""
        with self._lock:
            return LaneStatistics(len(self._queue), self._busy, self._submitted,
                                  self._completed, self._ran_inline, self._closed is not None)

    def submit(self, work: Work, *, inline: bool, collective: bool = False) -> None:
        """Queue ``work``, or run it now on this thread if ``inline`` and the lane is idle.

        With ``collective``, the Work's operation's ``seq`` is set to the lane's next
        sequence number under the lane's lock, so that sequence order is execution order
        even with several threads.

        Raises:
            DistBackendError: the lane was closed (its group was shut down or aborted); the
                message is the reason it was closed with.
        """
        with self._lock:
            if self._closed is not None:
                raise DistBackendError(str(self._closed))
            if collective:
                work.operation.seq = self.next_seq
                self.next_seq += 1
            self._submitted += 1
            run_here = inline and not self._busy and not self._queue
            if run_here:
                self._busy = True
                self._ran_inline += 1
                self._owner = threading.get_ident()
            else:
                work.lane = self
                self._queue.append(work)
                self._start_locked()
        if run_here:
            try:
                work.run(True)
            finally:
                with self._lock:
                    self._busy = False
                    self._completed += 1
                    self._owner = None
                    if self._queue:
                        self._start_locked()

    def help_until(self, work: Work) -> None:
        """Called by a thread about to wait for ``work``: if that thread is the one running
        this lane's current Work (a completion callback that waits), run the queued Works,
        in order, here until ``work`` is done; otherwise do nothing (someone else runs them).
        """
        me = threading.get_ident()
        while not work.is_completed():
            with self._lock:
                if self._owner != me or not self._queue:
                    return
                nxt = self._queue.popleft()
            try:
                nxt.run()  # still under our running Work: one at a time, in submission order
            finally:
                with self._lock:
                    self._completed += 1

    def _start_locked(self) -> None:
        """Make sure something drains the queue (lock held)."""
        if self._pool is None:
            if self._thread is None:
                self._thread = threading.Thread(target=self._thread_loop,
                                                name=f"{self.name}-comm", daemon=True)
                self._thread.start()
            self._wake.notify()
        elif not self._busy:
            self._busy = True
            self._pool.run(self._drain)

    def _thread_loop(self) -> None:
        while True:
            with self._lock:
                while (self._busy or not self._queue) and self._closed is None:
                    self._wake.wait()
                if not self._queue:
                    return
                work = self._queue.popleft()
                self._busy = True
                self._owner = threading.get_ident()
            try:
                work.run()
            finally:
                with self._lock:
                    self._busy = False
                    self._completed += 1
                    self._owner = None
            # not kept while the thread waits for the next: its tensors belong to the user
            del work

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._busy = False
                    self._owner = None
                    return
                work = self._queue.popleft()
                self._owner = threading.get_ident()
            try:
                work.run()
            finally:
                with self._lock:
                    self._completed += 1
            del work  # not kept while the thread waits for the next

    def pending(self) -> int:
        """How many Works wait in the queue (not counting one that runs)."""
        with self._lock:
            return len(self._queue)

    def join(self, timeout: float) -> None:
        """Wait at most ``timeout`` seconds for the lane's own thread to end (after close);
        nothing to wait for from that thread itself or for a pooled lane.

        Why: a thread still finishing a Work when the program exits may be inside a torch
        call that gave the GIL up; Python ends such a thread when it takes the GIL back
        during the interpreter's finalization, and torch's C++ frames turn that into
        "terminate called without an active exception" (the process aborts).
        """
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("%s: the thread of lane %r still runs a Work %.1f s after its "
                            "group was destroyed (a completion callback that blocks?); the "
                            "program may abort at exit if it is inside torch then",
                            thread.name, self.name, timeout)

    def close(self, reason: BaseException) -> None:
        """Refuse new Work and fail every queued one with ``reason``; a running one goes on
        until the backend (closed or aborted by the caller) makes it fail."""
        with self._lock:
            if self._closed is None:
                self._closed = reason
            dropped = list(self._queue)
            self._queue.clear()
            self._wake.notify_all()
        for work in dropped:
            work.fail(reason)


__all__ = ["Lane", "LaneStatistics", "WorkerPool"]

"""Work: the handle of one queued or finished operation, with torch's ``Work`` methods.

A Work is created when an operation is submitted to its group and completed exactly once,
by whichever thread ran it (the caller's, for a synchronous operation on an idle group, or
the group's communication thread). ``wait()`` blocks until then and raises the operation's
error; ``get_future()`` gives a ``torch.futures.Future`` whose value is the list of output
tensors, as torch's does. Completion callbacks (copy-backs of staged outputs) run before
anyone waiting is woken, so a woken waiter always sees its results in place.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from ringtorch._errors import DistBackendError
from ringtorch._observe.operation import COLLECTIVE, Operation
from ringtorch._observe.recorder import RECORDER
from ringtorch.collectives import profiling

_now = time.monotonic


class Work:
    """One operation of a ProcessGroup (see the module docstring): the handle of its
    ``Operation`` (``operation``), which says what it is and how it went.

    Attributes:
        operation: the operation's object (identity, stamps, outcome; what the flight
            recorder keeps).
        op_name: what the operation is ("allreduce", "send", ...), for messages.
        seq: the group's sequence number of the collective (-1 for point-to-point).
    """

    # One is made per operation, on its path: slots spare the instance a dictionary.
    __slots__ = ("operation", "_run_fn", "_outputs", "_exception", "_source_rank_value",
                 "_done", "_event", "_lock", "_future", "_on_finish", "lane", "__weakref__")

    def __init__(self, op_name: str, seq: int, run: Callable[[Operation], Any] | None,
                 outputs: list[torch.Tensor] | None = None, group_name: str = "",
                 operation: Operation | None = None) -> None:
        if operation is None:
            operation = Operation(COLLECTIVE, group_name, op_name)
            operation.seq = seq
        self.operation = operation
        self._run_fn = run
        self._outputs: list[torch.Tensor] = outputs if outputs is not None else []
        self._source_rank_value = -1
        self._done = False
        # Made only when someone waits before completion: most synchronous Works complete
        # on the caller's thread before anyone waits, and an Event costs microseconds.
        self._exception: BaseException | None = None
        self._event: threading.Event | None = None
        self._future: Any = None
        self._on_finish: list[Callable[[], None]] | None = None
        # The lane it is queued on (set by Lane.submit), whose help_until a wait calls first.
        self.lane: Any = None
        self._lock = threading.Lock()

    @property
    def op_name(self) -> str:
        return self.operation.op

    @property
    def seq(self) -> int:
        return self.operation.seq

    @seq.setter
    def seq(self, value: int) -> None:
        self.operation.seq = value

    @property
    def group_name(self) -> str:
        return self.operation.group

    # -- run by the group ---------------------------------------------------------------------

    def add_finish_step(self, step: Callable[[], None]) -> None:
        """Run ``step`` after the operation succeeds and before waiters wake (copy-backs)."""
        if self._on_finish is None:
            self._on_finish = []
        self._on_finish.append(step)

    def run(self, at_once: bool = False) -> None:
        """Run the operation on this thread and complete the Work; never raises.

        The operation function gets the Work's operation, its start stamp and deadline set
        (the deadline: its ``timeout`` after the start, when it has one); an int it returns
        is the source rank of a receive. ``at_once``: the caller's thread runs it as it
        issues it (a synchronous operation on an idle group), so its issue stamp is its
        start stamp too, which spares a clock read."""
        o = self.operation
        started = o.started = o.enqueued if at_once else _now()
        if o.timeout >= 0.0:
            o.deadline = started + o.timeout
        try:
            result = self._run_fn(o) if self._run_fn is not None else None
            if isinstance(result, int):
                self._source_rank_value = result
            if self._on_finish is not None:
                for step in self._on_finish:
                    step()
        except BaseException as exc:
            self._complete(exc)
        else:
            self._complete(None)

    def fail(self, exc: BaseException) -> None:
        """Complete the Work with ``exc`` without running it (its group was shut down)."""
        self._complete(exc)

    def _complete(self, exc: BaseException | None) -> None:
        with self._lock:
            if self._done:
                return
            self._exception = exc
            self._run_fn = None
            self._done = True
            event, future = self._event, self._future
        o = self.operation
        if exc is not None:  # kept before the stamp: whoever sees the stamp sees the error
            o.failed(exc)
        o.finished = _now()
        if RECORDER.listeners and o.id >= 0:
            RECORDER.tell(o)
        profile = o.profile
        if profile is not None:  # dropped: it holds the inputs, and the ring keeps o
            o.profile = None
            profiling.end(profile)
        if event is not None:
            event.set()
        if future is not None:
            _settle(future, self._outputs, exc)

    # -- torch's Work API ---------------------------------------------------------------------

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the operation is done; raise its error if it failed.

        Args:
            timeout: give up after this long (a ``timedelta``; None waits for the operation,
                whose own deadline is the group's timeout).

        Returns:
            True, as torch's ``Work.wait`` does.

        Raises:
            DistBackendError: the operation failed (the original error, re-raised), or it was
                not done within ``timeout``.
        """
        if not self._done and self.lane is not None:
            self.lane.help_until(self)
        if not self._done:
            with self._lock:
                if not self._done and self._event is None:
                    self._event = threading.Event()
                event = self._event
            seconds = None if timeout is None else _seconds(timeout)
            if event is not None and not event.wait(seconds):
                raise DistBackendError(
                    f"{self._describe()} did not complete within {timeout} (Work.wait timed "
                    f"out; the operation itself keeps its own deadline)")
        if self._exception is not None:
            raise self._exception
        return True

    def is_completed(self) -> bool:
        """Whether the operation has finished, successfully or not."""
        return self._done

    def is_success(self) -> bool:
        """Whether the operation has finished without an error (False while it runs)."""
        return self._done and self._exception is None

    def exception(self) -> BaseException | None:
        """The operation's error, or None (also None while it runs)."""
        return self._exception

    def result(self) -> list[torch.Tensor]:
        """The operation's output tensors (waits for it first, like torch)."""
        self.wait()
        return list(self._outputs)

    def get_future(self) -> torch.futures.Future:
        """A ``torch.futures.Future`` completed with ``result()`` (or the error)."""
        with self._lock:
            if self._future is None:
                self._future = _WorkFuture(self)
                if self._done:
                    _settle(self._future, self._outputs, self._exception)
            return self._future

    def source_rank(self) -> int:
        """The group rank that sent the data of a receive from any source."""
        self.wait()
        if self._source_rank_value < 0:
            raise RuntimeError(f"{self.op_name} has no source rank: only a receive has one")
        return self._source_rank_value

    def _source_rank(self) -> int:
        """torch's private spelling of :meth:`source_rank`."""
        return self.source_rank()

    def synchronize(self) -> None:
        """Nothing to do on CPU (torch uses it to join CUDA streams)."""

    def block_current_stream(self) -> None:
        """Nothing to do on CPU."""

    def _get_sequence_number(self) -> int:
        return self.seq

    def _describe(self) -> str:
        where = f" on group '{self.group_name}'" if self.group_name else ""
        seq = f" #{self.seq}" if self.seq >= 0 else ""
        return f"{self.op_name}{seq}{where}"

    def __repr__(self) -> str:
        state = ("pending" if not self._done
                 else "failed" if self._exception is not None else "done")
        return f"<Work {self._describe()} {state}>"


class _WorkFuture(torch.futures.Future):
    """The future of a Work: a ``torch.futures.Future`` whose ``wait`` waits through the
    Work first, so that a completion callback waiting for a later Work of its own lane runs
    that Work instead of waiting for itself (comm_thread.Lane.help_until)."""

    def __init__(self, work: Work) -> None:
        super().__init__()
        self._work = work

    def wait(self) -> Any:
        if not self.done():
            # the future holds the Work's error too: it is raised by super().wait() below
            with contextlib.suppress(Exception):
                self._work.wait()
        return super().wait()


class DeviceWork(Work):
    """A Work whose outputs are device tensors: ``wait`` makes the calling thread's current
    stream wait for them, so ``synchronize`` and ``block_current_stream`` are that wait, as
    on torch's CUDA Works (the staged, IPC and NCCL paths' Works)."""

    __slots__ = ()

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()


def completed_work(op_name: str, outputs: list[torch.Tensor] | None = None) -> Work:
    """A Work that is already done (operations with nothing to do)."""
    work = Work(op_name, -1, None, outputs)
    work.run()
    return work


def joined_work(op_name: str, works: list[Work], outputs: list[torch.Tensor]) -> Work:
    """One Work standing for several, done when all are (their errors re-raised in order)."""
    def run(_: Operation) -> None:
        for w in works:
            w.wait()

    joined = Work(op_name, -1, run, outputs)
    if all(w.is_completed() for w in works):
        joined.run()
    else:
        threading.Thread(target=joined.run, name=f"ringtorch-{op_name}", daemon=True).start()
    return joined


def _settle(future: Any, outputs: list[torch.Tensor], exc: BaseException | None) -> None:
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(list(outputs))


def _seconds(timeout: Any) -> float:
    if isinstance(timeout, timedelta):
        return max(0.0, timeout.total_seconds())
    return max(0.0, float(timeout))


__all__ = ["DeviceWork", "Work", "completed_work", "joined_work"]

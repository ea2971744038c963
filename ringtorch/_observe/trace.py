"""The timeline's writer: each rank's Chrome trace events, buffered in memory, written once.

When tracing is on (``RINGTORCH_TRACE=DIR``, or ``ringrun --trace DIR``), ``TRACER`` listens
on the flight recorder for finished operations and keeps each one as it is (the record and
the thread that ran it, two list stores); the layers above add spans of their own (the RPC
server's handling of a request, DDP's backward and buckets). Nothing is formatted while the
job runs: ``write`` turns what was kept into trace events, on rank 0's clock (clock.py
measured the offset at start-up), and writes ``trace-<rank>.json``, a complete trace file by
itself; trace_merge.py joins the ranks' files into one.

The rule this module keeps: at most ``RINGTORCH_TRACE_MAX_EVENTS`` items are kept; past the
bound new ones are counted and dropped (the file says how many and from when), so a long job
keeps its beginning and never grows without limit. Like the recorder, it never raises into
the operation it observes. ``TRACER`` is this subsystem's one state object.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

from ringtorch import _config
from ringtorch._observe.files import write_json
from ringtorch._observe.operation import Operation
from ringtorch._observe.recorder import COLLECTIVE, P2P, RECORDER, Record, dtype_name

FORMAT = "ringtorch-trace"
VERSION = 1
_now = time.monotonic_ns
_thread_id = threading.get_native_id

# What a kept item is: a finished record, or a span the upper layers reported.
_RECORD, _SPAN, _INSTANT, _ASYNC = range(4)


class Clock:
    """How this rank's monotonic clock maps onto the trace's time axis.

    ``offset_ns`` is added to a local stamp to get rank 0's clock (the true offset lies within
    ``error_ns`` of it: half the shortest store round trip of the measurement); ``origin_ns``
    (rank 0's clock) is time zero of the trace, and ``origin_unix_ns`` the wall-clock time of
    that zero on rank 0.
    """

    def __init__(self, offset_ns: int = 0, error_ns: int = 0, origin_ns: int = 0,
                 origin_unix_ns: int = 0, rounds: int = 0) -> None:
        self.offset_ns = offset_ns
        self.error_ns = error_ns
        self.origin_ns = origin_ns
        self.origin_unix_ns = origin_unix_ns
        self.rounds = rounds

    def us(self, stamp: int) -> float:
        """A local ``time.monotonic_ns()`` stamp as trace time (microseconds)."""
        return (stamp + self.offset_ns - self.origin_ns) / 1000.0

    def describe(self) -> dict[str, Any]:
        return {"reference": "rank 0's CLOCK_MONOTONIC", "offset_ns": self.offset_ns,
                "error_bound_ns": self.error_ns, "rounds": self.rounds,
                "origin_unix_ns": self.origin_unix_ns}


class Tracer:
    """This process's trace events (see the module docstring); ``on`` says whether it keeps any."""

    def __init__(self) -> None:
        self.on = False
        self.rank = -1
        self.world_size = -1
        self.directory = ""
        self.run_id = ""
        self.clock = Clock()
        self.capacity = 0
        self.dropped = 0
        self.first_drop_ns = 0
        self._items: list[tuple[Any, ...]] = []
        self._threads: dict[int, str] = {}
        self._ids = itertools.count()
        self._written = -1  # how many items the last write held

    # -- life cycle ---------------------------------------------------------------------------

    def start(self, directory: str, rank: int, world_size: int, clock: Clock,
              run_id: str) -> None:
        """Begin keeping events (again: what an earlier start kept is forgotten)."""
        self.stop()
        self.directory = directory
        self.rank, self.world_size = rank, world_size
        self.clock, self.run_id = clock, run_id
        self.capacity = _config.TRACE_MAX_EVENTS.get()
        if self.capacity <= 0:
            raise ValueError(f"RINGTORCH_TRACE_MAX_EVENTS must be > 0, got {self.capacity}")
        self.dropped, self.first_drop_ns, self._written = 0, 0, -1
        self._items, self._threads = [], {}
        RECORDER.listeners.append(self._on_record)
        self.on = True

    def stop(self) -> None:
        """Stop keeping events (what was kept stays until the next start)."""
        self.on = False
        if self._on_record in RECORDER.listeners:
            RECORDER.listeners.remove(self._on_record)

    # -- what is kept -------------------------------------------------------------------------

    def _keep(self, item: tuple[Any, ...]) -> None:
        if len(self._items) >= self.capacity:
            self._drop()
            return
        tid = _thread_id()
        if tid not in self._threads:
            self._threads[tid] = threading.current_thread().name
        self._items.append((tid, *item))

    def _drop(self) -> None:
        if not self.dropped:
            self.first_drop_ns = _now()
        self.dropped += 1

    def _on_record(self, rec: Operation) -> None:
        """The recorder's listener (on only while tracing): keep the finished record, with
        the thread that ran it. The hot path of tracing, hence written out flat."""
        items = self._items
        if len(items) >= self.capacity:
            self._drop()
            return
        tid = _thread_id()
        if tid not in self._threads:
            self._threads[tid] = threading.current_thread().name
        items.append((tid, _RECORD, rec))

    def span(self, cat: str, name: str, start_ns: int, end_ns: int,
             args: dict[str, Any] | None = None) -> None:
        """A complete event on this thread, from ``start_ns`` to ``end_ns`` (monotonic ns)."""
        if self.on:
            self._keep((_SPAN, cat, name, start_ns, end_ns, args))

    def instant(self, cat: str, name: str, args: dict[str, Any] | None = None) -> None:
        """A moment on this thread (now)."""
        if self.on:
            self._keep((_INSTANT, cat, name, _now(), 0, args))

    def async_span(self, cat: str, name: str, start_ns: int, end_ns: int,
                   args: dict[str, Any] | None = None) -> None:
        """An interval that may overlap others (shown on its own track, not this thread's)."""
        if self.on:
            self._keep((_ASYNC, cat, name, start_ns, end_ns, args))

    @contextlib.contextmanager
    def timed(self, cat: str, name: str, args: dict[str, Any] | None = None) -> Iterator[None]:
        """A complete event on this thread around the ``with`` body (its error, if any, in
        the event's args)."""
        start = _now()
        try:
            yield
        except BaseException as exc:
            self.span(cat, name, start, _now(), {**(args or {}),
                                                 "error": type(exc).__name__})
            raise
        self.span(cat, name, start, _now(), args)

    # -- the file -----------------------------------------------------------------------------

    def path(self, directory: str | None = None) -> str:
        """Where this rank's file goes: ``trace-<rank>.json`` in ``directory``."""
        return os.path.join(directory or self.directory, f"trace-{self.rank}.json")

    def changed(self) -> bool:
        """Whether events came in since the last write."""
        return self._written != len(self._items) + self.dropped

    def events(self) -> list[dict[str, Any]]:
        """What was kept, as trace events (metadata events first)."""
        items = list(self._items)
        threads = dict(self._threads)
        pid, clock = self.rank, self.clock
        host = socket.gethostname()
        out: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0,
             "args": {"name": f"rank {self.rank} ({host})"}},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
             "args": {"sort_index": self.rank}}]
        for tid, name in sorted(threads.items()):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0,
                        "args": {"name": name}})
        sites: dict[tuple[Any, int], str] = {}
        for number, item in enumerate(items):
            tid, kind = item[0], item[1]
            if kind == _RECORD:  # numbered by its place among the items kept
                out.extend(record_events(Record.of(item[2], number), pid, tid, clock, sites))
                continue
            _, _, cat, name, start, end, args = item
            event: dict[str, Any] = {"name": name, "cat": cat, "pid": pid, "tid": tid,
                                     "ts": clock.us(start), "args": args or {}}
            if kind == _SPAN:
                out.append({**event, "ph": "X", "dur": max(0, end - start) / 1000.0})
            elif kind == _INSTANT:
                out.append({**event, "ph": "i", "s": "t"})
            else:
                ident = f"{pid}.a{next(self._ids)}"
                out.append({**event, "ph": "b", "id": ident})
                out.append({**event, "ph": "e", "id": ident, "ts": clock.us(end), "args": {}})
        return out

    def document(self) -> dict[str, Any]:
        """This rank's whole trace file: events and what a reader needs to trust them."""
        events = self.events()
        rank_info = {"host": socket.gethostname(), "pid": os.getpid(),
                     "clock": self.clock.describe(), "kept": len(self._items),
                     "dropped": self.dropped, "max_events": self.capacity}
        if self.dropped:
            rank_info["dropped_from_us"] = self.clock.us(self.first_drop_ns)
        return {"traceEvents": events, "displayTimeUnit": "ms",
                "otherData": {"format": FORMAT, "version": VERSION, "run_id": self.run_id,
                              "world_size": self.world_size,
                              "ranks": {str(self.rank): rank_info}}}

    def write(self, directory: str | None = None) -> str:
        """Write this rank's file (atomically) and return its path."""
        count = len(self._items) + self.dropped
        path = self.path(directory)
        write_json(self.document(), path)
        self._written = count
        return path


def record_events(rec: Record, pid: int, tid: int, clock: Clock,
                  sites: dict[tuple[Any, int], str] | None = None) -> list[dict[str, Any]]:
    """The trace events of one finished operation: its queued phase (an async slice, since
    queued operations overlap) and its running phase (a complete event on the thread that
    ran it). ``sites`` caches call sites across calls (looking a line up is slow)."""
    if rec.kind in (COLLECTIVE, P2P):
        name = rec.op if rec.kind == COLLECTIVE else _p2p_name(rec)
    else:
        name = f"{rec.op} {rec.detail} -> {rec.peer}"
    args = _args(rec, {} if sites is None else sites)
    ident = f"{pid}.r{rec.id}"
    end = rec.finished or rec.started or rec.enqueued
    if rec.kind not in (COLLECTIVE, P2P):  # an RPC: in flight from issue to answer
        return [{"ph": "b", "cat": "rpc", "name": name, "id": ident, "pid": pid, "tid": tid,
                 "ts": clock.us(rec.enqueued), "args": args},
                {"ph": "e", "cat": "rpc", "name": name, "id": ident, "pid": pid, "tid": tid,
                 "ts": clock.us(end), "args": {}}]
    out: list[dict[str, Any]] = []
    ran = rec.started or end
    label = f"{name} #{rec.seq}" if rec.seq >= 0 else name
    out.append({"ph": "b", "cat": "queued", "name": f"{label} queued", "id": ident,
                "pid": pid, "tid": tid, "ts": clock.us(rec.enqueued),
                "args": {"group": rec.group, "seq": rec.seq}})
    out.append({"ph": "e", "cat": "queued", "name": f"{label} queued", "id": ident,
                "pid": pid, "tid": tid, "ts": clock.us(ran), "args": {}})
    if rec.started:
        out.append({"ph": "X", "cat": rec.kind, "name": name, "pid": pid, "tid": tid,
                    "ts": clock.us(rec.started), "dur": max(0, end - rec.started) / 1000.0,
                    "args": args})
    return out


def _p2p_name(rec: Record) -> str:
    towards = "to" if rec.op.startswith(("send", "isend")) else "from"
    return f"{rec.op} {towards} {rec.peer if rec.peer != -1 else 'any'}"


def _args(rec: Record, sites: dict[tuple[Any, int], str]) -> dict[str, Any]:
    args: dict[str, Any] = {"group": rec.group, "state": rec.state,
                            "queued_us": (rec.started - rec.enqueued) / 1000.0
                            if rec.started else None}
    if rec.seq >= 0:
        args["seq"] = rec.seq
    call = rec.call
    nbytes = rec.size()
    if nbytes >= 0:
        args["nbytes"] = nbytes
    if call is not None:
        if call.dtype is not None:
            args["dtype"] = dtype_name(call.dtype)
        if call.redop is not None:
            args["redop"] = call.redop.name
        if call.root >= 0:
            args["root"] = call.root
    route = rec.travelled()
    if route is not None and route != (None, None):  # a closed backend cannot say any more
        args["transport"], args["algorithm"] = route
    if rec.peer != -1:
        args["peer"] = rec.peer
    if rec.detail:
        args["detail"] = rec.detail
    if rec.code is not None:
        key = (rec.code, rec.lasti)
        site = sites.get(key)
        if site is None:
            site = sites[key] = rec.site()
        args["site"] = site
    if rec.error:
        args["error"] = rec.error
    return args


TRACER = Tracer()

__all__ = ["FORMAT", "TRACER", "VERSION", "Clock", "Tracer", "record_events", "write_json"]

"""The flight recorder: every rank's bounded ring of its last operations, always on.

Each collective, point-to-point operation and RPC call is one ``Operation`` (operation.py),
made when the user issues it and filled in as it runs; the recorder's ring keeps a reference
to it. Recording an operation costs the look at the user's frame (its call site), a running
number and one store into the ring: the operation itself exists whether or not anything
records it (``bench/recorder.py`` measures it). A dump, which is rare, copies the ring and does
the formatting; how an operation travelled (transport, algorithm) is asked of the backend
only then.

Why the ring is a ``collections.deque`` with a ``maxlen``: it is a fixed-size circular
buffer written in C, so a store is one call that no other thread can interrupt, and the
oldest reference leaves as the newest comes in, with nothing to trim or move. (A list
written at ``number % size`` needs the number and the store in two steps, and a thread
switched out between them for a while leaves a slot that a hand-over cannot tell from an old
one.) The running number comes from an ``itertools.count``, atomic under the GIL: numbers
are unique, and a dump sorts by them.

The rule this module keeps: the recorder never blocks on anything slow and never raises into
the operation it records. Writers do not lock, except the thread whose append to the
counter's queue reaches ``COUNT_EVERY`` (only while the summary counts), which hands those
records to the counter, and may wait for a snapshot of the counts in progress (tens of
microseconds, every few seconds). A dump copies the ring first and may see an operation half
updated, which it reports as it finds it. ``RECORDER`` is the process's one recorder (this
subsystem's one state object).
"""

from __future__ import annotations

import collections
import itertools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from itertools import compress
from operator import attrgetter, itemgetter, not_
from typing import Any

from ringtorch import _config
from ringtorch._observe.operation import COLLECTIVE, NO_SITE, P2P, RPC, Operation

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_now = time.monotonic
_getframe = sys._getframe
# How many codes' verified call sites the recorder remembers (see FlightRecorder._walk).
_VERIFIED_MAX = 1024
# How many records issued between two hand-overs to the counter (see
# FlightRecorder.count_with): few enough that the records handed over are still in the
# processor's caches (counting records thousands of operations old costs a cache miss each).
COUNT_EVERY = 64

FORMAT = "ringtorch-flight-record"
VERSION = 1


# A Record (a dump's copy of an operation) is a list, its fields at these positions.
(KIND, GROUP, OP, SITE, ENQUEUED, STARTED, FINISHED, SEQ, CALL, ROUTE, ERROR, NBYTES, PEER,
 DETAIL, ID, PARENT) = range(16)

_by_id = attrgetter("id")
_finished_of = attrgetter("finished")


def _ns(position: int) -> property:
    """A stamp field read as integer nanoseconds (0: not yet)."""
    def read(rec: list[Any]) -> int:
        return round(rec[position] * 1e9)
    return property(read)


class Record(list):  # type: ignore[type-arg]
    """A copy of one operation, as the dump, the hang report and the timeline read it (a list,
    see the positions above, that names its fields). ``Record.of(operation, id)`` copies the
    fields, so later writes to the live operation do not show in it: readers read a record
    once.

    Fields:
        id: the recorder's running number of the record (gaps: older ones were dropped).
        kind: COLLECTIVE, P2P or RPC.
        group: the process group's name (the RPC agent's worker name for RPC).
        op: the operation as the user called it ("allreduce", "send", "rpc_sync", ...).
        code, lasti: the user's frame that issued it: its code and the offset of the calling
            instruction (the line is looked up from it when dumped); code is None when no
            Python frame issued it (e.g. an autograd hook on torch's engine thread).
        enqueued, started, finished: ``time.monotonic_ns()`` stamps (0: not yet).
        seq: the group's sequence number of a collective (-1 until it is known, and for p2p).
        peer: the other rank of a p2p operation, the callee of an RPC (-1 otherwise).
        nbytes: bytes of the operation when the caller knows them (-1 otherwise).
        error: the error's first line if it failed ("" otherwise).
        call: the CollectiveCall the backend ran it as (None until it starts).
        route: what the operation travelled by, resolved at dump time: an object whose
            ``route(record)`` returns ``(transport, algorithm)`` (the backend), or None.
        detail: a short free text (an RPC's function name, a p2p tag).
        parent: the operation this one is a part of (an object collective), or None.
    """

    __slots__ = ()
    kind = property(itemgetter(KIND))
    group = property(itemgetter(GROUP))
    op = property(itemgetter(OP))
    code = property(lambda self: self[SITE][0])
    lasti = property(lambda self: self[SITE][1])
    id = property(itemgetter(ID))
    enqueued = _ns(ENQUEUED)
    started = _ns(STARTED)
    finished = _ns(FINISHED)
    seq = property(itemgetter(SEQ))
    call = property(itemgetter(CALL))
    route = property(itemgetter(ROUTE))
    error = property(itemgetter(ERROR))
    nbytes = property(itemgetter(NBYTES))
    peer = property(itemgetter(PEER))
    detail = property(itemgetter(DETAIL))
    parent = property(itemgetter(PARENT))

    @classmethod
    def of(cls, o: Operation, number: int) -> Record:
        """A copy of the live operation ``o``, numbered ``number``."""
        return cls([o.kind, o.group, o.op, o.site, o.enqueued, o.started, o.finished, o.seq,
                    o.call, o.route, o.error, o.nbytes, o.peer, o.detail, number,
                    getattr(o, "parent", None)])

    def size(self) -> int:
        """Bytes of the operation: as the caller gave them, else the call's (-1: unknown)."""
        if self.nbytes >= 0 or self.call is None:
            return int(self.nbytes)
        return int(self.call.nbytes)

    def site(self) -> str | None:
        """The user's call site as ``file:line`` (None when no Python frame issued it)."""
        if self.code is None:
            return None
        return f"{self.code.co_filename}:{line_of(self.code, self.lasti)}"

    def travelled(self) -> tuple[str | None, str | None] | None:
        """(transport, algorithm), asked of the backend now; None when it was never known,
        (None, None) when the backend cannot say any more (closed)."""
        if self.route is None:
            return None
        try:
            return self.route.route(self)
        except Exception:  # a closed backend may not know any more
            return None, None

    @property
    def state(self) -> str:
        """"queued", "running", "completed" or "failed"."""
        if self.finished:
            return "failed" if self.error else "completed"
        return "running" if self.started else "queued"


def line_of(code: Any, lasti: int) -> int:
    """The source line of the instruction at byte offset ``lasti`` of ``code``."""
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return int(line)
    return int(code.co_firstlineno)


class FlightRecorder:
    """The ring of the last ``capacity`` operations (0: recording is off).

    ``listeners`` are called with each operation as it finishes (the timeline's writer is
    one); they run on the operation's thread, so they must be quick and must not raise. A
    counter (``count_with``: the summary's totals) gets the newest records in batches instead.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self._settled = capacity is not None
        self.listeners: list[Callable[[Operation], None]] = []
        self._count: Callable[[list[Operation]], None] | None = None
        # Held while the ring is replaced and its records handed over; a dump and a snapshot
        # of the counts hold it too.
        self.count_lock = threading.RLock()
        self._late: list[Operation] = []  # handed over unfinished: counted once finished
        # The records not yet handed to the counter (None while nothing counts).
        self._fresh: list[Operation] | None = None
        self.configure(_config.FLIGHT_RECORDER.get() if capacity is None else capacity)
        self._settled = capacity is not None

    def settle(self) -> None:
        """Read the capacity knob again, once: a process may have been made (forked from a
        server that imported ringtorch) before its environment was set, so the first group
        or RPC agent of the process calls this. An explicit ``configure`` is final."""
        if not self._settled:
            self._settled = True
            capacity = _config.FLIGHT_RECORDER.get()
            if capacity != self.capacity:
                self.configure(capacity)

    def configure(self, capacity: int) -> None:
        """Start over with room for ``capacity`` records (0 turns recording off). The
        counter, if any, gets the records of the old ring."""
        if capacity < 0:
            raise ValueError(f"the flight recorder's capacity must be >= 0, got {capacity}")
        self._settled = True
        with self.count_lock:
            if self._count is not None:  # the old ring's records not yet handed over
                self._hand_over()
            self.capacity = capacity
            self.on = capacity > 0
            self._ring: collections.deque[Operation] = collections.deque(maxlen=capacity)
            self._numbers = itertools.count()
        # Call sites found by a full walk (see _walk); they hold their code objects, so an
        # id here is never one of a code object that has since been freed.
        self._verified: dict[int, tuple[Any, set[int]]] = {}
        # The last verified site: a loop issuing from one line finds it here, without the
        # table's look-up, and its operations share this tuple.
        self._last_site: tuple[Any, int] = (None, -1)
        # The folders of library code a call site is never in: ringtorch's and torch's.
        self._library: tuple[str, ...] | None = None

    def add(self, o: Operation, hint: int = 3) -> None:
        """Record the operation ``o`` being issued (call only when ``on``): look up its call
        site, number it and keep a reference in the ring.

        Its call site is the caller's first frame outside ringtorch (none when no Python
        frame issued it, e.g. an autograd hook on torch's engine thread). ``hint`` is how
        many frames above this call the public entry point usually is (``dist.all_reduce``
        above the group's method), so the user's frame is usually the one above that. See
        ``_walk`` for how that guess is checked without looking at the frames in between.
        The line is looked up from the instruction offset only when dumped.
        """
        try:  # the frame hint + 1 above the caller: the user's, if this is a known site
            frame: Any = _getframe(hint + 1)
            site = self._last_site  # one read: threads replace the pair whole
            if site[0] is not frame.f_code or site[1] != frame.f_lasti:
                site = self._site_of(frame, hint)
        except ValueError:  # a shallower stack than the hint
            site = self._walk(hint)
        o.site = site
        o.id = next(self._numbers)
        self._ring.append(o)
        fresh = self._fresh
        if fresh is not None:  # the summary counts: its queue, handed over in batches
            fresh.append(o)
            if len(fresh) >= COUNT_EVERY:
                self._maintain(fresh)

    def add_whole(self, o: Operation) -> None:
        """Record ``o``, an operation made of parts that record themselves (an object
        collective, whose tensor collectives name it their ``parent``): in the ring, with
        the user's call site found by a walk (they are rare), and not handed to the
        summary's counter, which counts its parts."""
        o.site = self._walk(-1)  # -1: never remembered as a verified site
        o.id = next(self._numbers)
        self._ring.append(o)

    def record(self, kind: str, group: str, op: str, hint: int = 3, peer: int | str = -1,
               nbytes: int = -1, detail: str = "") -> Operation:
        """A new operation, recorded (call only when ``on``): what an issuer that has made
        no Operation of its own calls (``hint`` as in ``add``, counting from this call)."""
        o = Operation(kind, group, op, nbytes, peer, detail)
        self.add(o, hint + 1)
        return o

    def _site_of(self, frame: Any, hint: int) -> tuple[Any, int]:
        """The site of an operation whose frame ``hint + 1`` above ``add``'s caller is
        ``frame`` and not the last site: from the table of verified sites, else walked."""
        code, lasti = frame.f_code, frame.f_lasti
        known = self._verified.get(id(code))
        if known is not None and known[0] is code and lasti in known[1]:
            site = self._last_site = (code, lasti)
            return site
        return self._walk(hint + 1)

    def _walk(self, hint: int) -> tuple[Any, int]:
        """The (code, instruction offset) of the user's frame that issued the operation,
        found by walking the stack from the bottom (``add`` tries the cache first).

        Looking at a frame makes Python build a frame object for it, which for the
        short-lived frames of ringtorch's own entry points costs more than the rest of the
        record. So ``add`` looks only at the frame ``hint + 1`` above its caller, where
        the user's frame is when the call came in through a public entry point, and accepts
        it when the same instruction of the same code was found to be the call site by this
        walk before (``_verified``: code id -> (code, instruction offsets)). An instruction
        that calls a public entry point calls it every time, so the cache gives the walk's
        answer; the one exception is a call instruction whose callee changes from call to
        call between ringtorch's entry point and a function of the user's that calls a
        group's method directly: the site reported for the latter is then that outer call
        instruction rather than the line inside the user's function. A site found exactly
        at ``hint + 1`` is remembered (at most ``_VERIFIED_MAX`` codes; the table starts
        over when full).
        """
        # torch's own Python (torch.distributed's functions, DeviceMesh, DTensor, the ops
        # of functional collectives) is library code too when it calls a ringtorch group
        # (backend "ringtorch"): the user's frame is the first one outside both packages
        library = self._library
        if library is None:  # found once torch is imported (this layer never imports it)
            torch_file = getattr(sys.modules.get("torch"), "__file__", None)
            if torch_file is None:
                library = _PACKAGE
            else:
                library = self._library = (_PACKAGE, os.path.dirname(torch_file) + os.sep)
        frame, depth = sys._getframe(2), 1  # depth counts from its caller: add()'s is 1
        while frame is not None and frame.f_code.co_filename.startswith(library):
            frame, depth = frame.f_back, depth + 1
        if frame is None:
            return NO_SITE
        site = (frame.f_code, frame.f_lasti)
        if depth == hint + 1:
            known = self._verified.get(id(site[0]))
            if known is None or known[0] is not site[0]:
                if len(self._verified) >= _VERIFIED_MAX:
                    self._verified.clear()
                known = self._verified[id(site[0])] = (site[0], set())
            known[1].add(site[1])
            self._last_site = site
        return site

    def _maintain(self, fresh: list[Operation]) -> None:
        """Hand the counter the records queued for it, every ``COUNT_EVERY`` records while
        they are still in the processor's caches (``add`` calls it)."""
        with self.count_lock:
            if fresh is self._fresh and len(fresh) >= COUNT_EVERY:  # else done meanwhile
                self._hand_over()

    def _hand_over(self) -> None:
        """Give the counter the records queued for it (the lock held). Other threads append
        to the queue meanwhile, at its end; the records taken leave from its front, each a
        single step, so none is lost or handed over twice."""
        fresh = self._fresh
        if fresh is None:
            return
        end = len(fresh)
        batch = fresh[:end]
        del fresh[:end]
        self._give(batch)

    def count_with(self, count: Callable[[list[Operation]], None] | None) -> None:
        """Hand every finished record, once, to ``count`` (None: stop): the summary's totals.

        Why in batches and not by a listener: a call per record on the operation's path
        costs more than the counting itself. So every ``COUNT_EVERY`` records the thread
        whose number reaches that mark hands the records issued since the last hand-over to
        ``count`` in one call, while they are still in the caches, and before any of them
        can leave the ring. One still running then is kept aside and handed over once
        finished (a record has finished when it has its finish stamp, stamped after its
        error). ``uncounted`` gives what has finished since, for a snapshot. ``count`` is
        called holding ``count_lock``, never on two threads at once. Records issued before
        this call are not counted.
        """
        with self.count_lock:
            self._count = count
            self._late = []
            self._fresh = [] if count is not None else None

    @property
    def counter(self) -> Callable[[list[Operation]], None] | None:
        """What ``count_with`` installed (None: nothing counts)."""
        return self._count

    def _give(self, fresh: list[Operation]) -> None:
        """Give the counter the finished operations of ``fresh`` and the finished ones kept
        aside (the count lock held); keep the unfinished ones aside."""
        count = self._count
        if count is None:
            return
        batch = self._late + fresh if self._late else fresh
        # one look at every stamp (other threads may finish operations meanwhile): each goes
        # to exactly one of the two lists
        stamps = list(map(_finished_of, batch))
        done = list(compress(batch, stamps))
        self._late = list(compress(batch, map(not_, stamps))) if len(done) < len(batch) else []
        if done:
            try:
                count(done)
            except Exception:  # counting must never break the operation
                pass

    def uncounted(self) -> list[Operation]:
        """The finished records not yet handed to the counter (for a snapshot: the totals
        are what was handed over plus these)."""
        with self.count_lock:
            return [o for o in self._late + list(self._fresh or ()) if o.finished]

    def finished(self, o: Operation, error: BaseException | None) -> None:
        """Keep ``error`` (if any), stamp the operation finished and tell the listeners; never
        raises. The error is kept before the stamp: whoever sees the stamp sees the error."""
        if error is not None:
            o.failed(error)
        o.finished = _now()
        if self.listeners:
            self.tell(o)

    def tell(self, o: Operation) -> None:
        """Call the listeners with an operation just finished; never raises. A Work stamps
        its operation itself and calls this only when there are listeners."""
        for listener in self.listeners:
            try:
                listener(o)
            except Exception:  # observing must never break the operation
                pass

    def records(self) -> list[Record]:
        """The last ``capacity`` records, oldest first, numbered (copies: later writes do
        not show)."""
        present = list(self._ring)  # one C call: no thread appends meanwhile
        present.sort(key=_by_id)  # a thread may have stored its number a little late
        return [Record.of(o, o.id) for o in present]

    def dump(self, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ring as a JSON-serialisable dict (format: docs/observability.md)."""
        wall, mono = time.time_ns(), time.monotonic_ns()
        records = self.records()
        first = records[0].id if records else 0
        out: dict[str, Any] = {
            "format": FORMAT, "version": VERSION,
            "rank": env_int("RANK"), "world_size": env_int("WORLD_SIZE"),
            "local_rank": env_int("LOCAL_RANK"), "pid": os.getpid(),
            "host": socket.gethostname(), "capacity": self.capacity,
            "dropped": first, "dumped_at_ns": wall,
            "entries": [to_dict(r, wall - mono) for r in records],
        }
        if extra:
            out.update(extra)
        return out


def env_int(name: str) -> int:
    """An integer environment variable set by the launcher (RANK, ...), or -1."""
    try:
        return int(os.environ.get(name, "-1"))
    except ValueError:
        return -1


def dtype_name(dtype: Any) -> str | None:
    """"float32" for torch.float32 (None for None), without importing torch."""
    return None if dtype is None else str(dtype).removeprefix("torch.")


def _wall(stamp: int, offset: int) -> int | None:
    return stamp + offset if stamp else None


def to_dict(rec: Record, offset: int) -> dict[str, Any]:
    """One record as the dump writes it (``offset`` turns monotonic stamps into Unix ns)."""
    call = rec.call
    out: dict[str, Any] = {
        "id": rec.id, "kind": rec.kind, "group": rec.group, "op": rec.op, "seq": rec.seq,
        "state": rec.state,
        "site": rec.site(),
        "function": rec.code.co_name if rec.code is not None else None,
        "enqueued_ns": _wall(rec.enqueued, offset), "started_ns": _wall(rec.started, offset),
        "finished_ns": _wall(rec.finished, offset),
        "nbytes": rec.size(),
    }
    if rec.peer != -1:
        out["peer"] = rec.peer
    if rec.detail:
        out["detail"] = rec.detail
    parent = rec.parent
    if parent is not None:  # a part of an object collective: which one
        out["parent"] = {"id": parent.id, "op": parent.op}
    if call is not None:
        out["call"] = {"op": call.op, "seq": call.seq, "dtype": dtype_name(call.dtype),
                       "redop": None if call.redop is None else call.redop.name,
                       "root": call.root, "nbytes": call.nbytes}
    route = rec.travelled()
    if route is not None:
        out["transport"], out["algorithm"] = route
    if rec.error:
        out["error"] = rec.error
    return out


RECORDER = FlightRecorder()

__all__ = ["CALL", "COLLECTIVE", "COUNT_EVERY", "DETAIL", "ENQUEUED", "ERROR", "FINISHED",
           "FORMAT", "GROUP", "ID", "KIND", "NBYTES", "NO_SITE", "OP", "P2P", "PARENT", "PEER",
           "RECORDER",
           "ROUTE", "RPC", "SEQ", "SITE", "STARTED", "VERSION", "FlightRecorder",
           "Operation", "Record", "dtype_name", "env_int", "line_of", "to_dict"]

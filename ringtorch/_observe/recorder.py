"""The flight recorder: every rank's bounded ring of its last operations, always on.

Each collective, point-to-point operation and RPC call gets one ``Record`` when the user
issues it: the group, the operation, the user's call site, and its timestamps (enqueued,
started, finished) and outcome, filled in as it runs. The collective's identity (dtype,
bytes, root, reduction: the ``CollectiveCall``) is attached by the backend when it starts, as
the object itself, not copied; how it travelled (transport, algorithm) is asked of the
backend only when the ring is dumped. So recording costs one small list (see ``Record``)
appended to the ring, two clock reads of its own (a collective's start stamp is also its
deadline's reference) and one look at the user's frame per operation (``bench/recorder.py``
measures it), and a dump, which is rare, does the formatting and the numbering.

Why the ring is a list that is trimmed rather than a circular array: an append is the
cheapest store Python has, and it needs no running number or index arithmetic per
operation. The list grows to ``capacity + TRIM_EVERY`` records, then its oldest
``TRIM_EVERY`` go in one step; a record's running number is its position plus the number
trimmed before it, worked out when the ring is read. The summary's counter
(``count_with``) is handed the records in batches from the ring itself: one length check
per operation serves both.

Why stamps are float seconds of ``time.monotonic()``: the deadline and the backend's
progress board are float seconds of that clock, so they take a record's start stamp as it
is; an integer stamp would need a conversion on the operation's path. Readers get
nanoseconds (``Record.enqueued``, ...), as the dump and the timeline write them.

The rule this module keeps: the recorder never blocks on anything slow and never raises into
the operation it records. Writers do not lock (an append is atomic under the GIL), except the
thread whose append reaches the next mark (every ``COUNT_EVERY`` operations when counting,
else every ``TRIM_EVERY``), which hands the new records to the counter and trims the ring,
and may wait for a snapshot of the counts in progress (tens of microseconds, every few
seconds). A dump copies the ring first and may see an operation half updated, which it
reports as it finds it. ``RECORDER`` is the process's one recorder (this subsystem's one state
object).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from itertools import compress
from operator import itemgetter, not_
from typing import Any

from ringtorch import _config

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_now = time.monotonic
_getframe = sys._getframe
# How many codes' verified call sites the recorder remembers (see FlightRecorder._walk).
_VERIFIED_MAX = 1024
# How many records leave the ring at once (fewer when the capacity is smaller): the ring
# holds at most capacity + TRIM_EVERY, and the trim moves the others' references down.
TRIM_EVERY = 256
# How many records issued between two hand-overs to the counter (see
# FlightRecorder.count_with): few enough that the records handed over are still in the
# processor's caches (counting records thousands of operations old costs a cache miss each).
COUNT_EVERY = 64

# What a record is about.
COLLECTIVE = "collective"
P2P = "p2p"
RPC = "rpc"

FORMAT = "ringtorch-flight-record"
VERSION = 1


# A record is a plain list, its fields at these positions. Writers on the operation's path
# store by position (``entry[STARTED] = now``); readers take a ``Record``, which names them.
# ID is only in the copies ``records()`` makes: a live record has no running number.
(KIND, GROUP, OP, SITE, ENQUEUED, STARTED, FINISHED, SEQ, CALL, ROUTE, ERROR, NBYTES, PEER,
 DETAIL, ID) = range(15)
# A site: (code, instruction offset) of the user's frame, or NO_SITE. One tuple per call site,
# shared by every record made there: a record allocates nothing for its site.
NO_SITE: tuple[Any, int] = (None, 0)


_finished_of = itemgetter(FINISHED)


def _ns(position: int) -> property:
    """A stamp field read as integer nanoseconds (0: not yet)."""
    def read(rec: list[Any]) -> int:
        return round(rec[position] * 1e9)
    return property(read)


class Record(list):  # type: ignore[type-arg]
    """A copy of one record (a list, see the positions above) that names its fields.

    Why a record is a list and not an object with attributes: one is made for every
    operation, on the operation's path, and Python builds a list display in a third of the
    time it takes to construct an instance (``bench/recorder.py`` measures the recorder's
    cost per operation). ``Record.of(entry, id)`` copies the list, so later writes to the
    live record do not show in it: dumps and the timeline read a record once.

    Fields:
        id: the recorder's running number of the record (gaps: older ones were dropped).
        kind: COLLECTIVE, P2P or RPC.
        group: the process group's name (the RPC agent's worker name for RPC).
        op: the operation as the user called it ("allreduce", "send", "rpc_sync", ...).
        code, lasti: the user's frame that issued it: its code and the offset of the calling
            instruction (the line is looked up from it when dumped); code is None when no
            Python frame issued it (e.g. an autograd hook on torch's engine thread). The
            live record keeps the pair as one shared tuple (SITE).
        enqueued, started, finished: ``time.monotonic_ns()`` stamps (0: not yet); the live
            record keeps them as ``time.monotonic()`` seconds (0.0: not yet).
        seq: the group's sequence number of a collective (-1 until it is known, and for p2p).
        peer: the other rank of a p2p operation, the callee of an RPC (-1 otherwise).
        nbytes: bytes of the operation when the caller knows them (-1 otherwise).
        error: the error's first line if it failed ("" otherwise).
        call: the CollectiveCall the backend ran it as (None until it starts).
        route: what the operation travelled by, resolved at dump time: an object whose
            ``route(record)`` returns ``(transport, algorithm)`` (the backend), or None.
        detail: a short free text (an RPC's function name, a p2p tag).
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

    @classmethod
    def of(cls, entry: list[Any], number: int) -> Record:
        """A copy of the live record ``entry``, numbered ``number``."""
        return cls([*entry[:ID], number])

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


def failed(entry: list[Any], error: BaseException) -> None:
    """Keep the first line of the error a record's operation ended with; never raises."""
    try:
        text = str(error).strip().splitlines()
        entry[ERROR] = f"{type(error).__name__}: {text[0] if text else ''}"
    except Exception:  # a broken __str__ must not break the operation
        entry[ERROR] = type(error).__name__


def line_of(code: Any, lasti: int) -> int:
    """The source line of the instruction at byte offset ``lasti`` of ``code``."""
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return int(line)
    return int(code.co_firstlineno)


class FlightRecorder:
    """The ring of the last ``capacity`` records (0: recording is off).

    ``listeners`` are called with each record as it finishes (the timeline's writer is one);
    they run on the operation's thread, so they must be quick and must not raise. A counter
    (``count_with``: the summary's totals) gets the newest records in batches instead.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self._settled = capacity is not None
        self.listeners: list[Callable[[list[Any]], None]] = []
        self._count: Callable[[list[list[Any]]], None] | None = None
        # Held while the ring is trimmed or replaced and its records handed over; a dump and
        # a snapshot of the counts hold it too.
        self.count_lock = threading.RLock()
        self._late: list[list[Any]] = []  # handed over unfinished: counted once finished
        self._ring: list[list[Any]] = []
        self._counted = self._dropped = 0
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
                self._hand_over(self._ring[self._counted - self._dropped:])
            self.capacity = capacity
            self.on = capacity > 0
            self._ring = []  # see the module docstring: oldest first, trimmed by _maintain
            self._trim_by = max(1, min(capacity, TRIM_EVERY))
            self._trim_at = capacity + self._trim_by
            self._dropped = 0  # records trimmed from this ring so far
            self._counted = 0  # records of this ring handed to the counter (or kept aside)
            self._set_due()
        # Call sites found by a full walk (see _walk); they hold their code objects, so an
        # id here is never one of a code object that has since been freed.
        self._verified: dict[int, tuple[Any, set[int]]] = {}
        # The last verified site: a loop issuing from one line finds it here, without the
        # table's look-up, and its records share this tuple.
        self._last_site: tuple[Any, int] = (None, -1)

    def record(self, kind: str, group: str, op: str, hint: int = 3, peer: int | str = -1,
               nbytes: int = -1, detail: str = "") -> list[Any]:
        """A new record of an operation being issued (call only when ``on``): the live
        list, whose fields its operation's path stores by position (see ``Record``).

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
        entry = [kind, group, op, site, _now(), 0.0, 0.0, -1, None, None, "", nbytes, peer,
                 detail]
        ring = self._ring  # one read: a concurrent configure() swaps the whole ring
        ring.append(entry)
        if len(ring) >= self._due:
            self._maintain(ring)
        return entry

    def _site_of(self, frame: Any, hint: int) -> tuple[Any, int]:
        """The site of an operation whose frame ``hint + 1`` above ``record``'s caller is
        ``frame`` and not the last site: from the table of verified sites, else walked."""
        code, lasti = frame.f_code, frame.f_lasti
        known = self._verified.get(id(code))
        if known is not None and known[0] is code and lasti in known[1]:
            site = self._last_site = (code, lasti)
            return site
        return self._walk(hint + 1)

    def _walk(self, hint: int) -> tuple[Any, int]:
        """The (code, instruction offset) of the user's frame that issued the operation,
        found by walking the stack from the bottom (``record`` tries the cache first).

        Looking at a frame makes Python build a frame object for it, which for the
        short-lived frames of ringtorch's own entry points costs more than the rest of the
        record. So ``record`` looks only at the frame ``hint + 1`` above its caller, where
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
        frame, depth = sys._getframe(2), 1  # depth counts from its caller: record()'s is 1
        while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
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

    def _maintain(self, ring: list[list[Any]]) -> None:
        """Hand the counter the records issued since its last hand-over, every
        ``COUNT_EVERY`` records while they are still in the processor's caches, and let the
        oldest records leave a full ring (``record`` calls it when the ring reaches
        ``_due``)."""
        with self.count_lock:
            if ring is not self._ring or len(ring) < self._due:
                return  # replaced, or done meanwhile by another thread
            if self._count is not None:
                end = len(ring)  # once: other threads' appends may go on meanwhile
                self._counted, start = self._dropped + end, self._counted - self._dropped
                self._hand_over(ring[start:end])
            if len(ring) >= self._trim_at:  # the records leaving were handed over just now
                del ring[:self._trim_by]  # only here, under the lock; appends go on at the end
                self._dropped += self._trim_by
            self._set_due()

    def _set_due(self) -> None:
        """The ring's length at which ``record`` calls ``_maintain`` next (the lock held)."""
        due = self._trim_at
        if self._count is not None:
            due = min(due, self._counted - self._dropped + COUNT_EVERY)
        self._due = due

    def count_with(self, count: Callable[[list[list[Any]]], None] | None) -> None:
        """Hand every finished record, once, to ``count`` (None: stop): the summary's totals.

        Why in batches and not by a listener: a call per record on the operation's path
        costs more than the counting itself. So every ``COUNT_EVERY`` records the thread
        whose append reaches that mark hands the records issued since the last hand-over to
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
            self._counted = self._dropped + len(self._ring)
            self._set_due()

    @property
    def counter(self) -> Callable[[list[list[Any]]], None] | None:
        """What ``count_with`` installed (None: nothing counts)."""
        return self._count

    def _hand_over(self, fresh: list[list[Any]]) -> None:
        """Give the counter the finished records of ``fresh`` and the finished ones kept
        aside (the count lock held); keep the unfinished ones aside."""
        count = self._count
        if count is None:
            return
        batch = self._late + fresh if self._late else fresh
        # one look at every stamp (other threads may finish records meanwhile): each record
        # goes to exactly one of the two lists
        stamps = list(map(_finished_of, batch))
        done = list(compress(batch, stamps))
        self._late = list(compress(batch, map(not_, stamps))) if len(done) < len(batch) else []
        if done:
            try:
                count(done)
            except Exception:  # counting must never break the operation
                pass

    def uncounted(self) -> list[list[Any]]:
        """The finished records not yet handed to the counter (for a snapshot: the totals
        are what was handed over plus these)."""
        with self.count_lock:
            present = self._late + self._ring[self._counted - self._dropped:]
            return [entry for entry in present if entry[FINISHED]]

    def finished(self, entry: list[Any], error: BaseException | None) -> None:
        """Keep ``error`` (if any), stamp the record finished and tell the listeners; never
        raises. The error is kept before the stamp: whoever sees the stamp sees the error."""
        if error is not None:
            failed(entry, error)
        entry[FINISHED] = _now()
        if self.listeners:
            self.tell(entry)

    def tell(self, entry: list[Any]) -> None:
        """Call the listeners with a record just finished; never raises. A Work stamps its
        record itself and calls this only when there are listeners."""
        for listener in self.listeners:
            try:
                listener(entry)
            except Exception:  # observing must never break the operation
                pass

    def records(self) -> list[Record]:
        """The last ``capacity`` records, oldest first, numbered (copies: later writes do
        not show)."""
        with self.count_lock:  # the numbering needs the ring and its trimmed count together
            present, first = list(self._ring), self._dropped
        skip = max(0, len(present) - self.capacity)
        return [Record.of(entry, first + skip + i) for i, entry in enumerate(present[skip:])]

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
           "FORMAT", "GROUP", "ID", "KIND", "NBYTES", "NO_SITE", "OP", "P2P", "PEER", "RECORDER",
           "ROUTE", "RPC", "SEQ", "SITE", "STARTED", "TRIM_EVERY", "VERSION", "FlightRecorder",
           "Record", "dtype_name", "env_int", "failed", "line_of", "to_dict"]

"""Operation: the one object of one operation (a collective, a point-to-point operation, an RPC
call), made once when it is issued and filled in as it runs.

Its identity (kind, group, op name, sequence number, bytes, peer, detail), its deadline, its
user's call site, its stamps (issued, started, finished), its outcome, the collective as the
backend runs it (``call``), how it travelled (``route``), and its profiler range while it
runs. The Work a group hands back wraps it, the backend attaches to it what it
learns, and the flight recorder's ring keeps a reference to it: the dump, the hang report,
the timeline and the end-of-job summary all read these same objects.

The rules this module keeps: an operation holds no tensor once it has finished (whoever
completes it drops its profiler range, which holds its inputs), so the ring keeps nothing
alive but the small object itself; and a field is written by the one thread that runs that
part of the operation, so nothing here locks.

Why the stamps are float seconds of ``time.monotonic()``: the deadline and the backend's
progress board are float seconds of that clock, so they take an operation's start stamp as
it is. Readers get nanoseconds from a ``Record`` (recorder.py).
"""

from __future__ import annotations

import time
from typing import Any

_now = time.monotonic

# What an operation is.
COLLECTIVE = "collective"
P2P = "p2p"
RPC = "rpc"

# A site: (code, instruction offset) of the user's frame, or NO_SITE. One tuple per call site,
# shared by every operation issued there: an operation allocates nothing for its site.
NO_SITE: tuple[Any, int] = (None, 0)


class Operation:
    """One operation (see the module docstring).

    Attributes:
        kind: COLLECTIVE, P2P or RPC.
        group: the process group's name (the RPC agent's worker name for RPC).
        op: the operation as the group names it ("allreduce", "send", "rpc_sync", ...).
        seq: the group's sequence number of a collective (-1 until it is known, and for p2p).
        nbytes: bytes of the operation when the caller knows them (-1 otherwise).
        peer: the other rank of a p2p operation, the callee of an RPC (-1 otherwise).
        detail: a short free text (an RPC's function name, a p2p tag).
        site: the user's frame that issued it, (code, instruction offset), or NO_SITE;
            looked up once, by the flight recorder, when it records the operation.
        enqueued, started, finished: ``time.monotonic()`` seconds (0.0: not yet).
        timeout: seconds it may run, given by its issuer (-1.0: none); its deadline is
            taken from it when it starts.
        deadline: ``time.monotonic()`` by which it must finish (0.0 until it starts, and
            when it has no timeout).
        call: the CollectiveCall the backend ran it as (None until it starts, and for p2p).
        route: what it travelled by, asked at dump time: an object whose ``route(record)``
            returns ``(transport, algorithm)`` (the backend), or None.
        error: ``"Type: first line"`` of the error it ended with ("" otherwise).
        profile: its torch.profiler range while one is open (None otherwise).
        id: the flight recorder's running number of it (-1 while not recorded).
        warn_after: seconds after its start at which its next stall warning is due (-1.0:
            not read yet; the backend reads the setting only if it waits that long).
        scratch: what the backend running it must undo when it ends (NumPy's
            floating-point error state), so that no backend keeps per-call state.
        ahead: what the backend's slow waits of it scheduled ahead of its deadline (the
            peers' status query, the hang report's start); unset until one of its waits is
            slow (``getattr(o, "ahead", None)``).
        parent: the operation it is a part of (an object collective's, whose tensor
            collectives are its parts); unset otherwise (``getattr(o, "parent", None)``:
            unset costs an operation nothing).
    """

    __slots__ = ("kind", "group", "op", "seq", "nbytes", "peer", "detail", "site", "enqueued",
                 "started", "finished", "timeout", "deadline", "call", "route", "error", "profile",
                 "id", "warn_after", "scratch", "ahead", "parent")
    # unset until someone sets them (see above): declared for the type checker only
    ahead: Any
    parent: Operation

    def __init__(self, kind: str, group: str, op: str, nbytes: int = -1,
                 peer: int | str = -1, detail: str = "") -> None:
        self.kind = kind
        self.group = group
        self.op = op
        self.seq = -1
        self.nbytes = nbytes
        self.peer = peer
        self.detail = detail
        self.site = NO_SITE
        self.enqueued = _now()
        self.started = self.finished = self.deadline = 0.0
        self.timeout = -1.0
        self.call: Any = None  # a CollectiveCall (collectives/ is above this layer)
        self.route: Any = None
        self.profile: Any = None
        self.scratch: Any = None
        self.error = ""
        self.id = -1
        self.warn_after = -1.0

    def failed(self, error: BaseException) -> None:
        """Keep the first line of the error the operation ended with; never raises."""
        try:
            text = str(error).strip().splitlines()
            self.error = f"{type(error).__name__}: {text[0] if text else ''}"
        except Exception:  # a broken __str__ must not break the operation
            self.error = type(error).__name__

    def __repr__(self) -> str:
        state = ("failed" if self.error else "completed") if self.finished else (
            "running" if self.started else "queued")
        seq = f" #{self.seq}" if self.seq >= 0 else ""
        return f"<Operation {self.kind} {self.op}{seq} on '{self.group}' {state}>"


def issued(op: str, seq: int, deadline: float, group: str = "") -> Operation:
    """A collective operation started now, for callers that drive a backend directly
    (benchmarks, a backend's own tests): what a group's lane makes of an issued call."""
    o = Operation(COLLECTIVE, group, op)
    o.seq = seq
    o.started = o.enqueued
    o.deadline = deadline
    return o


__all__ = ["COLLECTIVE", "NO_SITE", "P2P", "RPC", "Operation", "issued"]

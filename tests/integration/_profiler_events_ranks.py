"""Rank-side code of tests/integration/test_profiler_events.py: one operation after another
inside torch's profiler, under ringtorch or torch's gloo (the same code for both), and the
profiler's events for them.

Each operation runs in a ``record_function`` range named after it, so the driver can tell
which "<backend>:<op>" events belong to which call, whatever a library records in between.
Then an asynchronous all_reduce whose completion rank 0 watches: its event must lie within
the time rank 0 measured from before the issue to the completion seen, and cover the time
in which rank 1 could not have joined yet.
"""

from __future__ import annotations

import importlib
import os
import time
import warnings
from typing import Any

import torch

from ringtorch.testing import wait_for

# operation -> what this rank calls (rank, world size, library's module)
_OPS = {
    "all_reduce": lambda r, ws, d: d.all_reduce(torch.ones(4)),
    "all_reduce_async": lambda r, ws, d: d.all_reduce(torch.ones(4), async_op=True).wait(),
    "broadcast": lambda r, ws, d: d.broadcast(torch.ones(4), 0),
    "reduce": lambda r, ws, d: d.reduce(torch.ones(4), 0),
    "all_gather": lambda r, ws, d: d.all_gather([torch.zeros(4) for _ in range(ws)],
                                                torch.ones(4)),
    "all_gather_into_tensor": lambda r, ws, d: d.all_gather_into_tensor(torch.zeros(4 * ws),
                                                                        torch.ones(4)),
    "gather": lambda r, ws, d: d.gather(torch.ones(4), [torch.zeros(4) for _ in range(ws)]
                                        if r == 0 else None, 0),
    "scatter": lambda r, ws, d: d.scatter(torch.zeros(4), [torch.ones(4) for _ in range(ws)]
                                          if r == 0 else None, 0),
    "all_to_all_single": lambda r, ws, d: d.all_to_all_single(torch.zeros(2 * ws),
                                                              torch.ones(2 * ws)),
    "all_to_all": lambda r, ws, d: d.all_to_all([torch.zeros(3) for _ in range(ws)],
                                                [torch.ones(3) for _ in range(ws)]),
    "all_reduce_coalesced": lambda r, ws, d: d.all_reduce_coalesced([torch.ones(2),
                                                                     torch.ones(5)]),
    "barrier": lambda r, ws, d: d.barrier(),
    "send_recv": lambda r, ws, d: (d.send(torch.ones(5), 1) if r == 0
                                   else d.recv(torch.zeros(5), 0)),
    "recv_any_source": lambda r, ws, d: (d.recv(torch.zeros(6)) if r == 0
                                         else d.send(torch.ones(6), 0)),
    "isend_irecv": lambda r, ws, d: (d.isend(torch.ones(7), 1) if r == 0
                                     else d.irecv(torch.zeros(7), 0)).wait(),
}
OPS = list(_OPS)


def events(rank: int, ws: int, library: str, folder: str) -> dict[str, Any]:
    """{operation: [(event name, input shapes, asynchronous)] of the "gloo:" events inside its
    range}, and under "timed" the spans (start, end in µs) of the asynchronous all_reduce's
    event and of the ranges that bound it (rank 0; ``folder``: where rank 0 tells rank 1 it
    may join)."""
    dist: Any = importlib.import_module(library)
    dist.init_process_group("gloo")
    dist.barrier()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.profiler.profile(record_shapes=True) as prof:
            for op, call in _OPS.items():
                with torch.profiler.record_function(f"op:{op}"):
                    call(rank, ws, dist)
                dist.barrier()  # the next operation's events start after this one's end
            _timed(rank, dist, os.path.join(folder, "issued"))
    ranges = [e for e in prof.events() if e.name.startswith("op:")]
    comm = [e for e in prof.events() if e.name.startswith("gloo:")]
    out: dict[str, Any] = {}
    for r in ranges:
        start, end = r.time_range.start, r.time_range.end
        out[r.name[3:]] = [(e.name, [list(s) for s in e.input_shapes], e.is_async)
                           for e in comm if start <= e.time_range.start <= end]
    spans = {e.name: (e.time_range.start, e.time_range.end) for e in prof.events()
             if e.name.startswith("timed:") or (e.name == "gloo:all_reduce"
                                                and [list(s) for s in e.input_shapes] == [[9]])}
    out["timed"] = spans
    dist.destroy_process_group()
    return out


def _timed(rank: int, dist: Any, marker: str) -> None:
    """Rank 0 issues an asynchronous all_reduce (input shape [9]) inside "timed:window",
    which ends once it sees the operation complete, and waits for it only after
    "timed:late" (a range that ended at the wait would end after it); "timed:alone" is a
    range it closes before it lets rank 1 join."""
    if rank == 0:
        with torch.profiler.record_function("timed:window"):
            work = dist.all_reduce(torch.ones(9), async_op=True)
            with torch.profiler.record_function("timed:alone"):
                pass
            with open(marker, "w"):
                pass
            wait_for(work.is_completed, 30, "the asynchronous all_reduce to complete")
        with torch.profiler.record_function("timed:late"):
            # not an ordering: the distance between the completion and the wait, measured
            # by the range, which torch's range ends well within
            time.sleep(0.05)
        work.wait()
    else:
        wait_for(lambda: os.path.exists(marker), 30, "rank 0 to issue its all_reduce")
        dist.all_reduce(torch.ones(9))
    dist.barrier()

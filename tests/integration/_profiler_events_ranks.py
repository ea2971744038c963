"""Rank-side code of tests/integration/test_profiler_events.py: one operation after another
inside torch's profiler, under ringtorch or torch's gloo (the same code for both), and the
profiler's events for them.

Each operation runs in a ``record_function`` range named after it, so the driver can tell
which "<backend>:<op>" events belong to which call, whatever a library records in between.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import torch

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


def events(rank: int, ws: int, library: str) -> dict[str, list[tuple[str, list]]]:
    """{operation: [(event name, input shapes)] of the "gloo:" events inside its range}."""
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
    ranges = [e for e in prof.events() if e.name.startswith("op:")]
    comm = [e for e in prof.events() if e.name.startswith("gloo:")]
    out: dict[str, list[tuple[str, list]]] = {}
    for r in ranges:
        start, end = r.time_range.start, r.time_range.end
        out[r.name[3:]] = [(e.name, [list(s) for s in e.input_shapes]) for e in comm
                           if start <= e.time_range.start <= end]
    dist.destroy_process_group()
    return out

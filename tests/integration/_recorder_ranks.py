"""Rank-side code of tests/integration/test_flight_recorder.py."""

from __future__ import annotations

import inspect
from typing import Any

import torch

import ringtorch.distributed as dist
import ringtorch.distributed.rpc as rpc
from ringtorch.distributed import flight_recorder
from ringtorch.testing import wait_for


def _line_of(marker: str) -> int:
    """The line of this file holding ``marker`` (so the test does not hard-code numbers)."""
    lines = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text and "_line_of" not in text)


def mixed_operations(rank: int, ws: int, transport: str) -> dict[str, Any]:
    """A few collectives, an async one, a p2p pair and a failing call; then the dump."""
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(256))  # site: all_reduce
    dist.broadcast(torch.zeros(3, dtype=torch.int64), src=1)  # site: broadcast
    work = dist.all_gather_into_tensor(torch.zeros(2 * ws), torch.ones(2), async_op=True)
    work.wait()
    if rank == 0:
        dist.send(torch.ones(5), dst=1)  # site: send
    elif rank == 1:
        dist.recv(torch.zeros(5), src=0)  # site: recv
    dist.barrier()
    record = flight_recorder.dump()
    dist.destroy_process_group()
    return {"record": record, "lines": {name: _line_of(f"# site: {name}") for name in
                                        ("all_reduce", "broadcast", "send", "recv")},
            "file": __file__}


def capacity_bound(rank: int, ws: int, capacity: int, calls: int) -> dict[str, Any]:
    """More calls than the ring holds: only the last ``capacity`` stay."""
    flight_recorder.reset(capacity)
    dist.init_process_group("gloo")
    for _ in range(calls):
        dist.all_reduce(torch.ones(1))
    record = flight_recorder.dump()
    dist.destroy_process_group()
    return record


def tensors_left_alive(rank: int, ws: int) -> dict[str, Any]:
    """Collectives (plain, and under torch.profiler, whose range records the inputs) and a
    p2p pair on tensors the rank then drops: which of them are still alive while the ring
    holds every operation, and whether the ring holds the very objects the Works wrapped."""
    import weakref

    from torch.autograd.profiler import profile

    from ringtorch._observe.recorder import RECORDER

    dist.init_process_group("gloo")
    tensors = [torch.ones(256), torch.ones(64), torch.zeros(2 * ws), torch.ones(8),
               torch.ones(5) if rank == 0 else torch.zeros(5)]
    dist.all_reduce(tensors[0])
    dist.broadcast(tensors[1], src=0)
    with profile(record_shapes=True):
        dist.all_gather_into_tensor(tensors[2], torch.ones(2))
        dist.all_reduce(tensors[3])
    work = dist.isend(tensors[4], dst=1) if rank == 0 else dist.irecv(tensors[4], src=0)
    work.wait()
    operation = work.operation
    refs = [weakref.ref(t) for t in tensors]
    del tensors, work
    # an async Work's lane thread still holds it for the moment between completing it (which
    # wakes wait()) and returning from it: wait, bounded, for every tensor to go
    try:
        wait_for(lambda: all(ref() is None for ref in refs), 5, "the tensors to be freed")
    except TimeoutError:
        pass
    alive = [i for i, ref in enumerate(refs) if ref() is not None]
    ring = list(RECORDER._ring)
    dist.destroy_process_group()
    return {"alive": alive, "held": any(o is operation for o in ring), "entries": len(ring)}


def failed_collective(rank: int, ws: int) -> dict[str, Any]:
    """Rank 1 calls a different collective at the same sequence number: both fail."""
    dist.init_process_group("gloo")
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(4))
        else:
            dist.broadcast(torch.ones(4), src=0)
    except dist.DistError:
        pass
    return flight_recorder.dump()


def rpc_calls(rank: int, ws: int) -> dict[str, Any] | None:
    """Worker 0 calls worker 1 three ways; one call raises on the callee."""
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=ws)
    record = None
    if rank == 0:
        rpc.rpc_sync("w1", torch.add, args=(torch.ones(2), 1))
        rpc.rpc_async("w1", torch.mul, args=(torch.ones(2), 3)).wait()
        rpc.remote("w1", torch.ones, args=(2,)).to_here()
        try:
            rpc.rpc_sync("w1", int, args=("not a number",))
        except ValueError:
            pass
        record = flight_recorder.dump()
    rpc.shutdown()
    return record


def recorder_off(rank: int, ws: int) -> dict[str, Any]:
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(4))
    record = flight_recorder.dump()
    dist.destroy_process_group()
    return {"enabled": flight_recorder.enabled(), "entries": record["entries"]}


def _reduce_in_a_helper(t: torch.Tensor) -> None:
    dist.all_reduce(t)  # site: helper


def _reduce_on_the_group(t: torch.Tensor) -> None:
    group = dist.group.WORLD
    group.allreduce([t]).wait()  # site: group method


def sites_of_each_call_shape(rank: int, ws: int) -> dict[str, Any]:
    """The same collective issued through each shape of stack, each shape several times
    (the recorder remembers sites it has walked to: the repeats check that what it
    remembers stays right), interleaved so that no shape follows itself."""
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)  # site: direct
        _reduce_in_a_helper(t)  # site: calls helper
        _reduce_on_the_group(t)  # site: calls group method
        for fn in (dist.all_reduce, _reduce_in_a_helper):
            fn(t)  # site: through a variable
        if rank == 0:
            dist.send(t, 1)  # site: sends
        else:
            dist.recv(t, 0)  # site: receives
    record = flight_recorder.dump()
    dist.destroy_process_group()
    return {"sites": [e["site"] for e in record["entries"] if e["op"] == "allreduce"],
            "p2p": [e["site"] for e in record["entries"] if e["kind"] == "p2p"],
            "lines": {name: _line_of(f"# site: {name}") for name in
                      ("direct", "helper", "group method", "through a variable")},
            "p2p_lines": [_line_of("# site: sends"), _line_of("# site: receives")],
            "file": __file__}


def object_collectives(rank: int, ws: int) -> dict[str, Any]:
    """An all_gather_object, and a send/recv_object_list from any source; then the dump."""
    dist.init_process_group("gloo")
    gathered: list[Any] = [None] * ws
    dist.all_gather_object(gathered, {"rank": rank})  # site: all_gather_object
    if rank == 0:
        dist.send_object_list([{"x": 1}, "two"], dst=1)  # site: send_object_list
    else:
        box: list[Any] = [None, None]
        dist.recv_object_list(box)  # site: recv_object_list
    record = flight_recorder.dump()
    dist.destroy_process_group()
    return {"record": record, "file": __file__,
            "lines": {name: _line_of(f"# site: {name}") for name in
                      ("all_gather_object", "send_object_list", "recv_object_list")}}

"""Rank-side code of tests/integration/test_shm_hierarchy.py: groups whose ranks are faked
onto several hosts (RINGTORCH_HOST_ID per rank, given as a string of host letters: "aabb" puts
ranks 0 and 1 on host a, ranks 2 and 3 on host b).

The ranks build NativeBackends (or a ProcessGroup) and send back what they saw; the
drivers compute expected values themselves with torch.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

import ringtorch.distributed as dist
from ringtorch._observe.operation import issued
from ringtorch._wire.channel import TcpChannel, UnixChannel
from ringtorch.collectives.backends.native import NativeBackend
from ringtorch.collectives.reduce_op import ReduceOp
from ringtorch.collectives.transports import hierarchy as shm_hierarchy
from ringtorch.testing import wait_for
from tests.integration import _shm_ranks


def knobs(hosts: str, rank: int) -> dict[str, Any]:
    """The knobs that put ``rank`` on host ``hosts[rank]`` (TCP between fake hosts goes
    through the loopback address)."""
    return {"HOST_ID": f"host-{hosts[rank]}", "SOCKET_ADDR": "127.0.0.1"}


def backend(rank: int, world_size: int, name: str, hosts: str, timeout_s: float = 30.0,
            **extra: Any) -> NativeBackend:
    return _shm_ranks.backend(rank, world_size, name, timeout_s, **knobs(hosts, rank), **extra)


def what_it_uses(b: NativeBackend) -> dict[str, Any]:
    """The decision, the topology, this rank's host domain and the transport to each peer."""
    h = b.transport if isinstance(b.transport, shm_hierarchy.HierarchyTransport) else None
    space = None if h is None else h.space
    mesh = b._mesh
    kinds = {} if mesh is None else {
        peer: "tcp" if isinstance(ch, TcpChannel) else "unix" if isinstance(ch, UnixChannel)
        else type(ch).__name__ for peer, ch in enumerate(mesh.coll) if ch is not None}
    return {"uses_shm": b.uses_shm, "reason": b.shm_reason, "topology": b.topology,
            "flat": _shm_ranks.flat_space(b) is not None,
            "domain": None if space is None else list(space.domain.names),
            "channels": kinds}


def cases(rank: int, world_size: int, hosts: str, cases: list[dict[str, Any]],
          off: tuple[int, ...] = (), sliced_from: int | None = None) -> dict[str, Any]:
    """Run every case (tests/integration/_shm_ranks.py's run_case) on one backend, with
    RINGTORCH_SHM=0 on the ranks in ``off`` (and all_reduces from ``sliced_from`` bytes
    sliced: shm_hierarchy.SLICED_FROM_NBYTES); report what the backend uses, every output
    and this rank's pid."""
    if sliced_from is not None:
        shm_hierarchy.SLICED_FROM_NBYTES = sliced_from
    b = backend(rank, world_size, f"h-{hosts}-{off}", hosts, SHM=rank not in off,
                SHM_CHUNK_BYTES=16 * 1024, SHM_ONESHOT_BYTES=4 * 1024)
    result = what_it_uses(b)
    for seq, case in enumerate(cases):
        result[case["key"]] = _shm_ranks.run_case(b, case, seq)
    b.close()
    result["pid"] = os.getpid()
    return result


def killed_rank(rank: int, world_size: int, hosts: str, victim: int) -> dict[str, Any]:
    """``victim`` runs as a forked child SIGKILLed 0.3 s into a stream of 4 MB all_reduces;
    the others report their first error, how long it took to come, and the next call's."""
    return _shm_ranks.kill_during_all_reduces(
        rank, victim, lambda: backend(rank, world_size, "kill", hosts))


def late_rank(rank: int, world_size: int, hosts: str, late: int,
              marker_dir: str) -> tuple[str, str]:
    """Every rank runs broadcast #1; rank ``late`` then waits while the others run
    all_reduce #2 with a 1 s deadline, and arrives once they have given up; every rank returns
    its error."""
    b = backend(rank, world_size, "late", hosts)
    b.broadcast(torch.zeros(4), 0, issued("broadcast", 1, time.monotonic() + 20))
    if rank == late:
        _shm_ranks.wait_until_the_others_are_done(rank, world_size, marker_dir)
        # the rank that gave up tells the others from a thread of its own, so its marker can
        # come before its abort frame; arrive only once the abort has: a late rank reading
        # the data sent before the abort could otherwise still complete the all_reduce
        wait_for(lambda: b.abort_state.cause is not None, 30, "the others' abort to arrive")
    try:
        b.all_reduce(torch.zeros(4), ReduceOp.SUM, issued("all_reduce", 2, time.monotonic() + 1.0))
        error = ("no error", "")
    except Exception as exc:
        error = (type(exc).__name__, str(exc))
    if rank != late:
        _shm_ranks.say_done(rank, marker_dir)
    b.close()
    return error


def subgroup(rank: int, world_size: int, hosts: str) -> dict[str, Any]:
    """A ProcessGroup world on fake hosts and a subgroup of every rank but 0: what each
    uses, and an all_reduce and a broadcast on each."""
    os.environ.update({"RINGTORCH_HOST_ID": f"host-{hosts[rank]}",
                       "RINGTORCH_SOCKET_ADDR": "127.0.0.1"})
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    sub = dist.new_group(list(range(1, world_size)))
    out: dict[str, Any] = {}
    for label, g in (("world", dist.group.WORLD), ("sub", sub)):
        if g == dist.GroupMember.NON_GROUP_MEMBER:
            continue
        # the engine's backend: new_group hands out torch's object for the group (one world)
        b = getattr(g, "engine", g)._get_backend()
        out[f"{label}/uses"] = what_it_uses(b)
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t, group=g)
        src = world_size - 1
        c = torch.full((3,), float(rank))
        dist.broadcast(c, src=src, group=g)
        out[f"{label}/results"] = (t.tolist(), c.tolist())
    dist.destroy_process_group()
    return out


def mismatch(rank: int, world_size: int, hosts: str, odd: str) -> tuple[str, str]:
    """The ranks in ``odd`` (digits) call broadcast #1, the others all_reduce #1; every rank
    returns its error."""
    b = backend(rank, world_size, "mm", hosts, timeout_s=20)
    t = torch.ones(8)
    try:
        if str(rank) in odd:
            b.broadcast(t, 0, issued("broadcast", 1, time.monotonic() + 20))
        else:
            b.all_reduce(t, ReduceOp.SUM, issued("all_reduce", 1, time.monotonic() + 20))
        error = ("no error", "")
    except Exception as exc:
        error = (type(exc).__name__, str(exc))
    b.close()
    return error


def aborted(rank: int, world_size: int, hosts: str, who: int) -> tuple[str, str]:
    """Rank ``who`` aborts the group while the others wait in all_reduce #1; every rank
    returns its error."""
    b = backend(rank, world_size, "abort", hosts)
    store = _shm_ranks.store(rank, world_size)
    try:
        if rank == who:  # once every other rank is about to wait in all_reduce #1
            store.wait([f"abort-entering/{r}" for r in range(world_size) if r != who])
            b.abort("the user gave up")
        else:
            store.set(f"abort-entering/{rank}", "1")
        b.all_reduce(torch.zeros(4), ReduceOp.SUM, issued("all_reduce", 1, time.monotonic() + 20))
        error = ("no error", "")
    except Exception as exc:
        error = (type(exc).__name__, str(exc))
    b.close()
    return error

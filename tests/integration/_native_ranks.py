"""Rank-side code of the NativeBackend tests: each function runs on every rank of a run_ranks world.

The ranks build NativeBackends directly (no ProcessGroup) and send back what they saw; the
driver (test_native_backend.py) computes every expected value itself from ``make_input``,
with torch, never with ringtorch. Every op x algorithm x dtype against NumPy is the
conformance suite's (tests/conformance/test_backend.py).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import timedelta
from typing import Any

import torch

from ringtorch import _config
from ringtorch._observe.operation import issued
from ringtorch.collectives.backends.base import BackendContext
from ringtorch.collectives.backends.native import NativeBackend
from ringtorch.collectives.reduce_op import ReduceOp
from ringtorch.store import PrefixStore, TCPStore
from ringtorch.testing import wait_for

_store: Any = None


def store(rank: int, world_size: int) -> Any:
    """This process's connection to the world's store (rank 0 hosts it)."""
    global _store
    if _store is None:
        _store = TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world_size, rank == 0,
                          timeout=timedelta(seconds=30))
    return _store


def backend(rank: int, world_size: int, name: str, algorithms: str = "",
            timeout_s: float = 30.0) -> NativeBackend:
    """A NativeBackend for group ``name`` on its socket transport (RINGTORCH_SHM off) with
    forced ``algorithms`` (RINGTORCH_ALGORITHMS)."""
    ctx = BackendContext(store=PrefixStore(f"{name}/", store(rank, world_size)), rank=rank,
                         size=world_size, timeout=timedelta(seconds=timeout_s), group_name=name,
                         global_ranks=tuple(range(world_size)))
    with _config.override(ALGORITHMS=algorithms, SHM=False):
        return NativeBackend(ctx)


def make_input(dtype: torch.dtype, rank: int, salt: int, n: int) -> torch.Tensor:
    """Small integer-valued data, exact in every dtype (sums and products stay small)."""
    k = torch.arange(n, dtype=torch.int64) * 3 + rank * 5 + salt
    if dtype is torch.bool:
        return k % 3 == 0
    if dtype.is_complex:
        return torch.complex((k % 5 - 2).double(), (k % 3).double()).to(dtype)
    if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        return (k % 4).to(dtype)
    return (k % 6 - 2).to(dtype)


def a2a_split(src: int, dst: int, n: int) -> int:
    """Elements rank ``src`` sends to rank ``dst`` in the all_to_all cases (uneven, some 0)."""
    return (src + 2 * dst) % 3 + n - 1


def reduce_with_the_root_op(rank: int, world_size: int) -> Any:
    """reduce where only the root passes MAX and the others SUM (seed 003 does): the root's op
    is the one applied. Returns the root's result."""
    b = backend(rank, world_size, "rootop")
    t = make_input(torch.float32, rank, 12, 5)
    b.reduce(t, ReduceOp.MAX if rank == world_size - 1 else ReduceOp.SUM, world_size - 1,
             issued("reduce", 1, time.monotonic() + 30))
    b.close()
    return t if rank == world_size - 1 else None


def random_all_reduce(rank: int, world_size: int, algorithms: list[str], n: int) -> list[Any]:
    """all_reduce SUM of random float32/bfloat16 data with each algorithm; the raw results."""
    out = []
    for i, algos in enumerate(algorithms):
        b = backend(rank, world_size, f"rand{i}", algos)
        for dtype in (torch.float32, torch.bfloat16):
            t = torch.randn(n, generator=torch.Generator().manual_seed(rank * 7919 + i))
            t = t.to(dtype)
            b.all_reduce(t, ReduceOp.SUM, issued("all_reduce", 1 if dtype is torch.float32 else 2,
                                                 time.monotonic() + 30))
            out.append(t)
        b.close()
    return out


def _posted_or_done(b: NativeBackend, peer: int) -> bool:
    """This rank's receive from ``peer`` waits for its message, or already got it."""
    st = b._mailbox.statistics()
    return st.waiting_receives == 1 or st.delivered[peer] == 1


def p2p_scenarios(rank: int, world_size: int) -> dict[str, Any]:
    """Point-to-point between ranks 0 and 1 (others idle): both receive first, tags out of
    order, any-source receive, a size mismatch."""
    b = backend(rank, world_size, "p2p")
    seen: dict[str, Any] = {}
    deadline = time.monotonic() + 30
    peer = 1 - rank
    if rank < 2:
        # both post their receive before sending (torch users do irecv; isend)
        got = torch.empty(1000)
        receiver = threading.Thread(target=lambda: seen.update(
            src=b.recv(got, peer, 0, deadline)))
        receiver.start()
        wait_for(lambda: _posted_or_done(b, peer), what="the receive to be posted")
        b.send(torch.arange(1000, dtype=torch.float32) + rank, peer, 0, deadline)
        receiver.join(30)
        seen["both_recv_first"] = got
        if rank == 0:
            b.send(torch.tensor([1]), 1, 11, deadline)
            b.send(torch.tensor([2]), 1, 22, deadline)
            b.send(torch.ones(3), 1, 33, deadline)
        else:
            t22, t11 = torch.empty(1, dtype=torch.int64), torch.empty(1, dtype=torch.int64)
            b.recv(t22, 0, 22, deadline)
            b.recv(t11, 0, 11, deadline)
            seen["tags"] = (int(t11), int(t22))
            try:
                b.recv(torch.empty(5), 0, 33, deadline)
            except Exception as exc:  # the size error is what the driver checks
                seen["size_error"] = (type(exc).__name__, str(exc))
    if rank == world_size - 1 and world_size > 2:
        b.send(torch.tensor([float(rank)]), 0, 5, deadline)
    if rank == 0 and world_size > 2:
        t = torch.empty(1)
        seen["any_source"] = (b.recv(t, None, 5, deadline), float(t))
    b.barrier(issued("barrier", 1, deadline))
    b.close()
    return seen


def mismatch(rank: int, world_size: int, kind: str) -> tuple[str, str]:
    """Ranks disagree (op, dtype or size) in collective #1; every rank returns its error."""
    b = backend(rank, world_size, "mm", timeout_s=20)
    deadline = time.monotonic() + 20
    last = rank == world_size - 1
    try:
        if kind == "op" and last:
            b.broadcast(torch.zeros(8), 0, issued("broadcast", 1, deadline))
        elif kind == "dtype" and last:
            b.all_reduce(torch.zeros(8, dtype=torch.float64), ReduceOp.SUM, issued("all_reduce", 1, deadline))
        elif kind == "size" and last:
            b.all_reduce(torch.zeros(9), ReduceOp.SUM, issued("all_reduce", 1, deadline))
        else:
            b.all_reduce(torch.zeros(8), ReduceOp.SUM, issued("all_reduce", 1, deadline))
        # a rank whose part finished before the mismatch was seen learns at its next call
        b.barrier(issued("barrier", 2, deadline))
    except Exception as exc:
        return type(exc).__name__, str(exc)
    finally:
        b.close()
    return "no error", ""


def killed_rank(rank: int, world_size: int, victim: int) -> dict[str, Any]:
    """``victim`` runs as a forked child that is SIGKILLed during a large all_reduce; the
    others report how long their all_reduce took to fail, and what the next call said."""
    if rank == victim:
        pid = os.fork()
        if pid == 0:  # the child plays rank `victim` and dies mid-collective
            try:
                b = backend(rank, world_size, "kill")
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
                t = torch.ones(2_000_000)
                for seq in range(1, 10_000):
                    b.all_reduce(t, ReduceOp.SUM, issued("all_reduce", seq, time.monotonic() + 60))
            finally:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        return {"victim_signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}
    b = backend(rank, world_size, "kill")
    t = torch.ones(2_000_000)
    seq = 0
    start = time.monotonic()
    try:
        while True:
            seq += 1
            start = time.monotonic()
            b.all_reduce(t, ReduceOp.SUM, issued("all_reduce", seq, time.monotonic() + 60))
    except Exception as exc:
        failed_after = time.monotonic() - start
        first = (type(exc).__name__, str(exc))
    start = time.monotonic()
    try:
        b.barrier(issued("barrier", seq + 1, time.monotonic() + 60))
        later: tuple[str, str] = ("no error", "")
    except Exception as exc:
        later = (type(exc).__name__, str(exc))
    later_after = time.monotonic() - start
    b.close()
    return {"first": first, "failed_after": failed_after, "later": later,
            "later_after": later_after, "ops": seq}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def timeout(rank: int, world_size: int, late: int) -> dict[str, Any]:
    """Every rank runs broadcast #1; rank ``late`` then waits while the others run
    all_reduce #2 with a 2.5 s deadline (stall warning after 1 s), and arrives once they
    have given up (each sets a store key)."""
    records = _Records()
    logging.getLogger("ringtorch").addHandler(records)
    b = backend(rank, world_size, "to")
    b.broadcast(torch.zeros(4), 0, issued("broadcast", 1, time.monotonic() + 20))
    result: dict[str, Any] = {}
    if rank == late:
        store(rank, world_size).wait([f"to-gave-up/{r}" for r in range(world_size) if r != late])
        try:
            b.all_reduce(torch.zeros(4), ReduceOp.SUM, issued("all_reduce", 2, time.monotonic() + 5))
            result["late"] = ("no error", "")
        except Exception as exc:
            result["late"] = (type(exc).__name__, str(exc))
    else:
        start = time.monotonic()
        with _config.override(STALL_WARNING_S=1.0):
            try:
                b.all_reduce(torch.zeros(4), ReduceOp.SUM, issued("all_reduce", 2, time.monotonic() + 2.5))
                result["error"] = ("no error", "")
            except Exception as exc:
                result["error"] = (type(exc).__name__, str(exc))
        result["after"] = time.monotonic() - start
        store(rank, world_size).set(f"to-gave-up/{rank}", "1")
    result["warnings"] = records.messages
    b.close()
    _leave_store(rank, world_size, "to")
    return result


def _leave_store(rank: int, world_size: int, name: str) -> None:
    """Rank 0 hosts the store: it returns (and its process ends) only after the others are
    done with it."""
    if rank == 0:
        store(rank, world_size).wait([f"{name}-left/{r}" for r in range(1, world_size)])
    else:
        store(rank, world_size).set(f"{name}-left/{rank}", "1")


def mixed_hosts(rank: int, world_size: int) -> dict[str, Any]:
    """Rank ``world_size - 1`` claims another host: its connections are TCP, the others'
    Unix; collectives work across the mix. Returns channel kinds and results."""
    host = "host-b" if rank == world_size - 1 else "host-a"
    with _config.override(HOST_ID=host, SOCKET_ADDR="127.0.0.1", SECRET="mixed-secret"):
        b = backend(rank, world_size, "mixed")
    kinds = [None if ch is None else type(ch).__name__ for ch in b._mesh.coll]  # type: ignore[union-attr]
    small = make_input(torch.float32, rank, 9, 10)
    b.all_reduce(small, ReduceOp.SUM, issued("all_reduce", 1, time.monotonic() + 30))
    large = make_input(torch.float64, rank, 10, 100_000)
    b.all_reduce(large, ReduceOp.SUM, issued("all_reduce", 2, time.monotonic() + 30))
    out = torch.empty(6 * world_size, dtype=torch.int32)
    b.all_gather(out, make_input(torch.int32, rank, 11, 6), issued("all_gather", 3, time.monotonic() + 30))
    b.close()
    return {"kinds": kinds, "small": small, "large": large, "gathered": out}


def wrong_secret(rank: int, world_size: int) -> tuple[str, str]:
    """Rank 1 has another job secret: making the group fails, naming the handshake."""
    store(rank, world_size)  # the store itself runs without a secret here
    try:
        with _config.override(SECRET="right" if rank != 1 else "wrong"):
            backend(rank, world_size, "secret", timeout_s=3.0).close()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


def killed_during_recv(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 1 (a forked child) dies while rank 0 waits in recv from it."""
    if rank == 1:
        pid = os.fork()
        if pid == 0:
            try:
                backend(rank, world_size, "p2pkill")
                store(rank, world_size).wait(["p2pkill/rank0-waits"])
                os.kill(os.getpid(), signal.SIGKILL)
            finally:
                os._exit(1)
        os.waitpid(pid, 0)
        return {}
    b = backend(rank, world_size, "p2pkill")

    def say_when_waiting() -> None:  # rank 0's receive is posted: rank 1 may die now
        wait_for(lambda: b._mailbox.statistics().waiting_receives == 1, what="the receive")
        store(rank, world_size).set("p2pkill/rank0-waits", "1")

    threading.Thread(target=say_when_waiting, daemon=True).start()
    start = time.monotonic()
    try:
        b.recv(torch.empty(4), 1, 0, time.monotonic() + 60)
        error: tuple[str, str] = ("no error", "")
    except Exception as exc:
        error = (type(exc).__name__, str(exc))
    after = time.monotonic() - start
    b.close()
    return {"error": error, "after": after}


def leaving_rank(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 1 closes its group (BYE) and leaves; ranks 0 and 2 go on talking to each other,
    and rank 0's receive from rank 1 fails saying it left."""
    b = backend(rank, world_size, "bye")
    b.barrier(issued("barrier", 1, time.monotonic() + 30))
    result: dict[str, Any] = {}
    if rank == 1:
        b.close()
        return result
    wait_for(lambda: 1 in b._mailbox.statistics().gone_peers, what="rank 1's goodbye")
    deadline = time.monotonic() + 30
    peer = 2 - rank
    got = torch.empty(3)
    if rank == 0:
        b.send(torch.ones(3), peer, 5, deadline)
        b.recv(got, peer, 6, deadline)
        try:
            b.recv(torch.empty(1), 1, 0, deadline)
            result["from_left"] = ("no error", "")
        except Exception as exc:
            result["from_left"] = (type(exc).__name__, str(exc))
    else:
        b.recv(got, peer, 5, deadline)
        b.send(torch.ones(3) * 2, peer, 6, deadline)
    result["got"] = got
    b.close()
    return result

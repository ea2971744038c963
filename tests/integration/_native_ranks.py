"""Rank-side code of the NativeBackend tests: each function runs on every rank of a run_ranks world.

The ranks build NativeBackends directly (no ProcessGroup), run the cases the driver gives
them and send back what they saw; the driver (test_native_backend.py) computes every expected
value itself from ``make_input``, with torch/NumPy, never with ringtorch.
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
from ringtorch.collectives.backends.base import BackendContext
from ringtorch.collectives.backends.native import NativeBackend
from ringtorch.collectives.reduce_op import ReduceOp, make_premul_sum
from ringtorch.store import PrefixStore, TCPStore

PREMUL_FACTOR = 2.0
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


def redop(name: str) -> Any:
    return make_premul_sum(PREMUL_FACTOR) if name == "PREMUL_SUM" else getattr(ReduceOp, name)


def _run_case(b: NativeBackend, case: dict[str, Any], seq: int) -> Any:
    r, ws = b.rank, b.size
    op, dtype, n, salt = case["op"], case["dtype"], case["n"], case["salt"]
    root = case.get("root", 0)
    deadline = time.monotonic() + 30
    if op in ("all_reduce", "reduce"):
        t = make_input(dtype, r, salt, n)
        if op == "all_reduce":
            b.all_reduce(t, redop(case["redop"]), seq, deadline)
            return t
        b.reduce(t, redop(case["redop"]), root, seq, deadline)
        return t if r == root else None
    if op == "reduce_root_op":  # seed 003: only the root passes MAX, the others SUM
        t = make_input(dtype, r, salt, n)
        b.reduce(t, ReduceOp.MAX if r == root else ReduceOp.SUM, root, seq, deadline)
        return t if r == root else None
    if op == "broadcast":
        t = make_input(dtype, r, salt, n)
        b.broadcast(t, root, seq, deadline)
        return t
    if op == "all_gather":
        out = torch.empty(n * ws, dtype=dtype)
        b.all_gather(out, make_input(dtype, r, salt, n), seq, deadline)
        return out
    if op == "gather":
        out = torch.empty(n * ws, dtype=dtype) if r == root else None
        b.gather(out, make_input(dtype, r, salt, n), root, seq, deadline)
        return out
    if op == "scatter":
        out = torch.empty(n, dtype=dtype)
        inp = make_input(dtype, r, salt, n * ws) if r == root else None
        b.scatter(out, inp, root, seq, deadline)
        return out
    if op == "reduce_scatter":
        out = torch.empty(n, dtype=dtype)
        b.reduce_scatter(out, make_input(dtype, r, salt, n * ws), redop(case["redop"]), seq,
                         deadline)
        return out
    if op == "reduce_scatter_inplace":  # out is this rank's block of inp (FSDP-style)
        inp = make_input(dtype, r, salt, n * ws)
        out = inp[r * n:(r + 1) * n]
        b.reduce_scatter(out, inp, redop(case["redop"]), seq, deadline)
        return out.clone()
    if op == "all_gather_inplace":  # inp is this rank's block of out
        out = torch.zeros(n * ws, dtype=dtype)
        out[r * n:(r + 1) * n] = make_input(dtype, r, salt, n)
        b.all_gather(out, out[r * n:(r + 1) * n], seq, deadline)
        return out
    if op == "all_to_all":
        in_splits = [a2a_split(r, j, n) for j in range(ws)]
        out_splits = [a2a_split(j, r, n) for j in range(ws)]
        out = torch.empty(sum(out_splits), dtype=dtype)
        b.all_to_all(out, make_input(dtype, r, salt, sum(in_splits)), out_splits, in_splits,
                     seq, deadline)
        return out
    if op == "barrier":
        b.barrier(seq, deadline)
        return None
    raise AssertionError(op)


def run_cases(rank: int, world_size: int, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Run every case (in order, on the backend named by its 'algorithms'); return results."""
    backends: dict[str, NativeBackend] = {}
    seqs: dict[str, int] = {}
    results = {}
    for case in cases:
        algos = case.get("algorithms", "")
        if algos not in backends:
            backends[algos] = backend(rank, world_size, f"g{len(backends)}", algos)
            seqs[algos] = 0
        seqs[algos] += 1
        results[case["key"]] = _run_case(backends[algos], case, seqs[algos])
    for b in backends.values():
        b.close()
    return results


def random_all_reduce(rank: int, world_size: int, algorithms: list[str], n: int) -> list[Any]:
    """all_reduce SUM of random float32/bfloat16 data with each algorithm; the raw results."""
    out = []
    for i, algos in enumerate(algorithms):
        b = backend(rank, world_size, f"rand{i}", algos)
        for dtype in (torch.float32, torch.bfloat16):
            t = torch.randn(n, generator=torch.Generator().manual_seed(rank * 7919 + i))
            t = t.to(dtype)
            b.all_reduce(t, ReduceOp.SUM, 1 if dtype is torch.float32 else 2,
                         time.monotonic() + 30)
            out.append(t)
        b.close()
    return out


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
        time.sleep(0.05)
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
    b.barrier(1, deadline)
    b.close()
    return seen


def mismatch(rank: int, world_size: int, kind: str) -> tuple[str, str]:
    """Ranks disagree (op, dtype or size) in collective #1; every rank returns its error."""
    b = backend(rank, world_size, "mm", timeout_s=20)
    deadline = time.monotonic() + 20
    last = rank == world_size - 1
    try:
        if kind == "op" and last:
            b.broadcast(torch.zeros(8), 0, 1, deadline)
        elif kind == "dtype" and last:
            b.all_reduce(torch.zeros(8, dtype=torch.float64), ReduceOp.SUM, 1, deadline)
        elif kind == "size" and last:
            b.all_reduce(torch.zeros(9), ReduceOp.SUM, 1, deadline)
        else:
            b.all_reduce(torch.zeros(8), ReduceOp.SUM, 1, deadline)
        # a rank whose part finished before the mismatch was seen learns at its next call
        b.barrier(2, deadline)
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
                    b.all_reduce(t, ReduceOp.SUM, seq, time.monotonic() + 60)
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
            b.all_reduce(t, ReduceOp.SUM, seq, time.monotonic() + 60)
    except Exception as exc:
        failed_after = time.monotonic() - start
        first = (type(exc).__name__, str(exc))
    start = time.monotonic()
    try:
        b.barrier(seq + 1, time.monotonic() + 60)
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
    """Every rank runs broadcast #1; rank ``late`` then sleeps while the others run
    all_reduce #2 with a 2.5 s deadline (stall warning after 1 s)."""
    records = _Records()
    logging.getLogger("ringtorch").addHandler(records)
    b = backend(rank, world_size, "to")
    b.broadcast(torch.zeros(4), 0, 1, time.monotonic() + 20)
    result: dict[str, Any] = {}
    if rank == late:
        time.sleep(4.0)
        try:
            b.all_reduce(torch.zeros(4), ReduceOp.SUM, 2, time.monotonic() + 5)
            result["late"] = ("no error", "")
        except Exception as exc:
            result["late"] = (type(exc).__name__, str(exc))
    else:
        start = time.monotonic()
        with _config.override(STALL_WARNING_S=1.0):
            try:
                b.all_reduce(torch.zeros(4), ReduceOp.SUM, 2, time.monotonic() + 2.5)
                result["error"] = ("no error", "")
            except Exception as exc:
                result["error"] = (type(exc).__name__, str(exc))
        result["after"] = time.monotonic() - start
    result["warnings"] = records.messages
    b.close()
    return result


def mixed_hosts(rank: int, world_size: int) -> dict[str, Any]:
    """Rank ``world_size - 1`` claims another host: its connections are TCP, the others'
    Unix; collectives work across the mix. Returns channel kinds and results."""
    host = "host-b" if rank == world_size - 1 else "host-a"
    with _config.override(HOST_ID=host, SOCKET_ADDR="127.0.0.1", SECRET="mixed-secret"):
        b = backend(rank, world_size, "mixed")
    kinds = [None if ch is None else type(ch).__name__ for ch in b._mesh.coll]  # type: ignore[union-attr]
    small = make_input(torch.float32, rank, 9, 10)
    b.all_reduce(small, ReduceOp.SUM, 1, time.monotonic() + 30)
    large = make_input(torch.float64, rank, 10, 100_000)
    b.all_reduce(large, ReduceOp.SUM, 2, time.monotonic() + 30)
    out = torch.empty(6 * world_size, dtype=torch.int32)
    b.all_gather(out, make_input(torch.int32, rank, 11, 6), 3, time.monotonic() + 30)
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
                time.sleep(0.3)
                os.kill(os.getpid(), signal.SIGKILL)
            finally:
                os._exit(1)
        os.waitpid(pid, 0)
        return {}
    b = backend(rank, world_size, "p2pkill")
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
    b.barrier(1, time.monotonic() + 30)
    result: dict[str, Any] = {}
    if rank == 1:
        b.close()
        return result
    time.sleep(0.3)  # rank 1 has left by now
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

"""Rank-side code of the shared-memory backend tests: each function runs on every rank of a
run_ranks world.

The ranks build NativeBackends directly (no ProcessGroup), run what the driver asks and
send back what they saw; the drivers (test_shm_*.py) compute expected values themselves from
``make_input`` with torch, never with ringtorch. The stress test is the exception that
proves the rule: its expected values are computed on the rank, with plain torch, from every
rank's deterministic input.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as tdist

from ringtorch import _config
from ringtorch._observe.operation import issued
from ringtorch.collectives.backends.base import BackendContext
from ringtorch.collectives.backends.native import NativeBackend
from ringtorch.collectives.reduce_op import ReduceOp, make_premul_sum
from ringtorch.collectives.transports.shm import ShmTransport
from ringtorch.testing import wait_for

PREMUL_FACTOR = 2.0
_store: Any = None


def store(rank: int, world_size: int) -> Any:
    """This process's connection to the world's store (rank 0 hosts it)."""
    global _store
    if _store is None:
        _store = tdist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world_size,
                                rank == 0, timeout=timedelta(seconds=30))
    return _store


def flat_space(b: NativeBackend) -> Any:
    """The slot space of a backend on shared memory within one host (None otherwise)."""
    return b.transport.space if isinstance(b.transport, ShmTransport) else None


def backend(rank: int, world_size: int, name: str, timeout_s: float = 30.0,
            **knobs: Any) -> NativeBackend:
    """A NativeBackend for group ``name``, built with the given knobs (SHM=False, ...).

    Ranks use one torch thread each: up to 4 ranks share 2 cores, and idle OpenMP workers
    spinning for work would starve the ranks the others wait for."""
    torch.set_num_threads(1)
    ctx = BackendContext(store=tdist.PrefixStore(f"{name}/", store(rank, world_size)), rank=rank,
                         size=world_size, timeout=timedelta(seconds=timeout_s), group_name=name,
                         global_ranks=tuple(range(world_size)))
    with _config.override(**knobs):
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


def random_input(dtype: torch.dtype, rank: int, salt: int, n: int) -> torch.Tensor:
    """Random normal data (rounding makes the order of a reduction visible in the bits)."""
    gen = torch.Generator().manual_seed(rank * 7919 + salt)
    return torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)


def redop(name: str) -> Any:
    return make_premul_sum(PREMUL_FACTOR) if name == "PREMUL_SUM" else getattr(ReduceOp, name)


def run_case(b: NativeBackend, case: dict[str, Any], seq: int) -> Any:
    """Run one collective described by ``case``; return this rank's output (or None)."""
    r, ws = b.rank, b.size
    op, dtype, n, salt = case["op"], case["dtype"], case["n"], case["salt"]
    root = case.get("root", 0)
    make = random_input if case.get("random") else make_input
    o = issued(op, seq, time.monotonic() + 30)
    if op in ("all_reduce", "reduce"):
        t = make(dtype, r, salt, n)
        if op == "all_reduce":
            b.all_reduce(t, redop(case["redop"]), o)
            return t
        b.reduce(t, redop(case["redop"]), root, o)
        return t if r == root else None
    if op == "broadcast":
        t = make(dtype, r, salt, n)
        b.broadcast(t, root, o)
        return t
    if op == "all_gather":
        out = torch.empty(n * ws, dtype=dtype)
        b.all_gather(out, make(dtype, r, salt, n), o)
        return out
    if op == "reduce_scatter":
        out = torch.empty(n, dtype=dtype)
        b.reduce_scatter(out, make(dtype, r, salt, n * ws), redop(case["redop"]), o)
        return out
    if op == "gather":
        out = torch.empty(n * ws, dtype=dtype) if r == root else None
        b.gather(out, make(dtype, r, salt, n), root, o)
        return out
    if op == "scatter":
        out = torch.empty(n, dtype=dtype)
        b.scatter(out, make(dtype, r, salt, n * ws) if r == root else None, root, o)
        return out
    if op == "barrier":
        b.barrier(o)
        return None
    raise AssertionError(op)


def run_cases(rank: int, world_size: int, cases: list[dict[str, Any]],
              configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Run every case on one backend per config (knobs by name); return the outputs keyed
    (config, case key), and whether each backend used shared memory."""
    results: dict[str, Any] = {}
    for cname, knobs in configs.items():
        b = backend(rank, world_size, f"c-{cname}", **knobs)
        results[f"uses_shm/{cname}"] = b.uses_shm
        for seq, case in enumerate(cases):  # the ProcessGroup numbers from 0
            results[f"{cname}/{case['key']}"] = run_case(b, case, seq)
        b.close()
    # rank 0 hosts the store: it leaves last, or a slower rank loses the store mid-setup
    if rank == 0:
        store(rank, world_size).wait([f"run_cases-left/{r}" for r in range(1, world_size)])
    else:
        store(rank, world_size).set(f"run_cases-left/{rank}", "1")
    return results


def growth(rank: int, world_size: int, max_bytes: int, nbytes: list[int]) -> list[Any]:
    """all_reduce float32 buffers of the given sizes; report (half, own segment size, result
    correct) after each."""
    b = backend(rank, world_size, "grow", SHM_MAX_BYTES=max_bytes)
    space = flat_space(b)
    assert space is not None
    seen: list[Any] = [(space.domain.half, space.domain.segments[rank].size, True)]
    for seq, n in enumerate(nbytes, start=1):
        t = torch.full((n // 4,), float(rank + 1))
        b.all_reduce(t, ReduceOp.SUM, issued("all_reduce", seq, time.monotonic() + 30))
        ok = bool((t == world_size * (world_size + 1) / 2).all())
        seen.append((space.domain.half, space.domain.segments[rank].size, ok))
    b.close()
    return seen


def decision(rank: int, world_size: int, knobs_by_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """Build a backend with this rank's knobs; report the decision and one all_reduce."""
    b = backend(rank, world_size, "decide", **knobs_by_rank[rank])
    t = make_input(torch.int64, rank, 1, 10)
    b.all_reduce(t, ReduceOp.SUM, issued("all_reduce", 1, time.monotonic() + 30))
    result = {"uses_shm": b.uses_shm, "reason": b.shm_reason, "sum": t}
    b.close()
    return result


STRESS_KNOBS = {"SHM_CHUNK_BYTES": 16 * 1024, "SHM_ONESHOT_BYTES": 4 * 1024,
                "SHM_MAX_BYTES": 160 * 1024}
STRESS_SIZES = [0, 1, 7, 100, 1000, 4096, 20_000, 50_000]


def stress(rank: int, world_size: int, seed: int, count: int,
           knobs: dict[str, Any] | None = None, sizes: list[int] | None = None) -> dict[str, Any]:
    """``count`` back-to-back collectives of random ops and sizes (the same schedule on every
    rank), each checked here against plain torch on every rank's deterministic input."""
    b = backend(rank, world_size, "stress", **(STRESS_KNOBS if knobs is None else knobs))
    rng = random.Random(seed)
    bad: list[str] = []
    ops = ["all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"]
    dtypes = [torch.float32, torch.int64, torch.float64, torch.bfloat16, torch.uint8]
    for seq in range(1, count + 1):
        op, dtype = rng.choice(ops), rng.choice(dtypes)
        n = rng.choice(STRESS_SIZES if sizes is None else sizes)
        case = {"op": op, "dtype": dtype, "n": n, "salt": seq, "root": rng.randrange(world_size),
                "redop": rng.choice(["SUM", "MAX"] if dtype is not torch.uint8 else ["MAX", "BOR"])}
        got = run_case(b, case, seq)
        want = _expected(case, rank, world_size)
        if want is not None and not torch.equal(got, want):
            bad.append(f"#{seq} {op} {dtype} n={n}")
    rotated = flat_space(b) is not None and flat_space(b).domain.spread_out
    b.close()
    return {"bad": bad, "count": count, "rotated": rotated}


def _expected(case: dict[str, Any], rank: int, ws: int) -> torch.Tensor | None:
    op, dtype, n, salt, root = case["op"], case["dtype"], case["n"], case["salt"], case["root"]
    if op == "barrier" or (op == "reduce" and rank != root):
        return None
    per = n * ws if op == "reduce_scatter" else n
    inputs = [make_input(dtype, j, salt, per) for j in range(ws)]
    if op == "broadcast":
        return inputs[root]
    if op == "all_gather":
        return torch.cat(inputs)
    wide = torch.stack([t.to(torch.int64) if dtype in (torch.int64, torch.uint8) else
                        t.to(torch.float64) for t in inputs])
    if case["redop"] == "SUM":
        total = wide.sum(0)
    elif case["redop"] == "MAX":
        total = wide.amax(0)
    else:
        total = torch.stack(inputs).to(torch.int64)
        acc = total[0]
        for row in total[1:]:
            acc = acc | row
        total = acc
    total = total.to(dtype)
    return total[rank * n:(rank + 1) * n] if op == "reduce_scatter" else total


def mismatch(rank: int, world_size: int, kind: str) -> tuple[str, str]:
    """Ranks disagree in collective #1 (the last rank differs); every rank returns its error."""
    b = backend(rank, world_size, "mm", timeout_s=20)
    deadline = time.monotonic() + 10
    last = rank == world_size - 1
    x = torch.zeros(8)
    try:
        if not last or kind == "none":
            b.all_reduce(x, ReduceOp.SUM, issued("all_reduce", 1, deadline))
        elif kind == "op":
            b.broadcast(x, 0, issued("broadcast", 1, deadline))
        elif kind == "dtype":
            b.all_reduce(x.double(), ReduceOp.SUM, issued("all_reduce", 1, deadline))
        elif kind == "size":
            b.all_reduce(torch.zeros(9), ReduceOp.SUM, issued("all_reduce", 1, deadline))
        elif kind == "redop":
            b.all_reduce(x, ReduceOp.MAX, issued("all_reduce", 1, deadline))
        elif kind == "socket_op":
            split = [8 // world_size] * world_size  # all_to_all stays on the sockets
            b.all_to_all(torch.zeros(8), x, split, split, issued("all_to_all", 1, deadline))
        b.barrier(issued("barrier", 2, deadline))  # a rank that finished #1 learns at its next call
    except Exception as exc:
        return type(exc).__name__, str(exc)
    finally:
        b.close()
    return "no error", ""


def root_mismatch(rank: int, world_size: int) -> tuple[str, str]:
    """broadcast #1 with root 0 everywhere except on the last rank (root 1)."""
    b = backend(rank, world_size, "rm", timeout_s=20)
    root = 1 if rank == world_size - 1 else 0
    try:
        b.broadcast(torch.zeros(4), root, issued("broadcast", 1, time.monotonic() + 10))
        b.barrier(issued("barrier", 2, time.monotonic() + 10))
    except Exception as exc:
        return type(exc).__name__, str(exc)
    finally:
        b.close()
    return "no error", ""


def killed_rank(rank: int, world_size: int, victim: int) -> dict[str, Any]:
    """``victim`` runs as a forked child SIGKILLed during a stream of large all_reduces; the
    others report how long their all_reduce took to fail, the error, and the next call's."""
    result = kill_during_all_reduces(rank, victim, lambda: backend(rank, world_size, "kill"))
    del result["pid"]
    return result


def kill_during_all_reduces(rank: int, victim: int,
                            make: Callable[[], NativeBackend]) -> dict[str, Any]:
    """Rank ``victim`` runs as a forked child SIGKILLed 0.3 s into a stream of 4 MB
    all_reduces on the backend ``make`` builds; it reports the child's signal, the others
    their first error, how long it took to come, the next call's error, and their pid."""
    if rank == victim:
        pid = os.fork()
        if pid == 0:  # the child plays rank `victim` and dies mid-collective
            try:
                b = make()
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
                t = torch.ones(1_000_000)
                for seq in range(1, 100_000):
                    b.all_reduce(t, ReduceOp.SUM, issued("all_reduce", seq, time.monotonic() + 60))
            finally:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        return {"victim_signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                "pid": pid}
    b = make()
    t = torch.ones(1_000_000)
    seq, start = 0, time.monotonic()
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
        b.all_reduce(t, ReduceOp.SUM, issued("all_reduce", seq + 1, time.monotonic() + 60))
        later: tuple[str, str] = ("no error", "")
    except Exception as exc:
        later = (type(exc).__name__, str(exc))
    later_after = time.monotonic() - start
    b.close()
    return {"first": first, "failed_after": failed_after, "later": later,
            "later_after": later_after, "ops": seq, "pid": os.getpid()}


def wait_until_the_others_are_done(rank: int, world_size: int, marker_dir: str) -> None:
    """Until every other rank has called ``say_done`` (TimeoutError after 30 s): a late rank that
    must arrive only after the others gave up on it, whatever the machine's load."""
    others = [os.path.join(marker_dir, f"done{r}") for r in range(world_size) if r != rank]
    wait_for(lambda: all(os.path.exists(p) for p in others), 30, "the other ranks to be done")


def wait_until_the_others_wait(b: NativeBackend, rank: int, world_size: int) -> None:
    """Until every other rank has entered the next shared-memory round and waits for this one
    (their round words say so: ShmDomain.statistics().peers_ahead)."""
    space = flat_space(b)
    assert space is not None, "the group does not use shared memory"
    domain = space.domain
    others = set(range(world_size)) - {rank}
    wait_for(lambda: set(domain.statistics().peers_ahead) == others,
             what=f"ranks {sorted(others)} to wait in the next round")


def say_done(rank: int, marker_dir: str) -> None:
    open(os.path.join(marker_dir, f"done{rank}"), "w").close()


def late_rank(rank: int, world_size: int, late: int, marker_dir: str) -> dict[str, Any]:
    """Every rank runs broadcast #1; rank ``late`` then waits while the others run
    all_reduce #2 with a 1.5 s deadline, and arrives once they have given up."""
    b = backend(rank, world_size, "late")
    b.broadcast(torch.zeros(4), 0, issued("broadcast", 1, time.monotonic() + 20))
    start = time.monotonic()
    if rank == late:
        wait_until_the_others_are_done(rank, world_size, marker_dir)
    try:
        b.all_reduce(torch.zeros(4), ReduceOp.SUM, issued("all_reduce", 2, time.monotonic() + 1.5))
        error = ("no error", "")
    except Exception as exc:
        error = (type(exc).__name__, str(exc))
    if rank != late:
        say_done(rank, marker_dir)
    after = time.monotonic() - start
    b.close()
    return {"error": error, "after": after}


def aborted(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 0 aborts the group while the others wait in all_reduce #1."""
    b = backend(rank, world_size, "abort")
    start = time.monotonic()
    try:
        if rank == 0:
            wait_until_the_others_wait(b, rank, world_size)
            b.abort("the user gave up")
        b.all_reduce(torch.zeros(4), ReduceOp.SUM, issued("all_reduce", 1, time.monotonic() + 20))
        error = ("no error", "")
    except Exception as exc:
        error = (type(exc).__name__, str(exc))
    after = time.monotonic() - start
    b.close()
    return {"error": error, "after": after}


def segment_names(b: NativeBackend) -> list[str]:
    space = flat_space(b)
    return [] if space is None else [seg.name for seg in space.domain.segments]


def leave(rank: int, world_size: int, how: str, record: str) -> list[str]:
    """Set up, run one all_reduce, note the segment names in ``record``, then leave ``how``:
    'close', 'exception' (rank 1 raises without closing) or 'sigkill' (rank 1 is killed)."""
    b = backend(rank, world_size, "leave")
    b.all_reduce(torch.ones(1000), ReduceOp.SUM, issued("all_reduce", 1, time.monotonic() + 20))
    names = segment_names(b)
    with open(f"{record}.{rank}", "w") as f:
        f.write("\n".join(names))
    b.barrier(issued("barrier", 2, time.monotonic() + 20))  # every rank has written its record
    if rank == 1 and how == "exception":
        raise RuntimeError("rank 1 fails on purpose")
    if rank == 1 and how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "close":
        b.close()
    else:
        time.sleep(1.0)  # the driver is killing the world meanwhile
    return names


def setup_abandoned(rank: int, world_size: int) -> tuple[int, str]:
    """Rank 0 sets up alone (rank 1 never joins the shared-memory setup) and times out;
    returns its pid and the error."""
    if rank == 1:  # stays until rank 0 gave up waiting for it
        store(rank, world_size).wait(["abandoned-gave-up"])
        store(rank, world_size).set("abandoned-seen", "1")
        return os.getpid(), ""
    ctx = BackendContext(store=tdist.PrefixStore("abandoned/", store(rank, world_size)), rank=0,
                         size=world_size, timeout=timedelta(seconds=1), group_name="abandoned",
                         global_ranks=(0, 1))
    from ringtorch._wire.shm_setup import open_domain

    try:
        open_domain(ctx.store, 0, world_size, "abandoned", "h", True, 1 << 20,
                       time.monotonic() + 1.0, str)
        error = "no error"
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    store(rank, world_size).set("abandoned-gave-up", "1")
    store(rank, world_size).wait(["abandoned-seen"])  # rank 0 hosts the store: rank 1 is done
    return os.getpid(), error


def late_for_the_first(rank: int, world_size: int) -> list[float]:
    """Rank 1 arrives late at collective #0 (the ProcessGroup's first sequence number): once
    the others wait for it, with only its empty descriptor to look at."""
    b = backend(rank, world_size, "first")
    if rank == 1:
        wait_until_the_others_wait(b, rank, world_size)
    t = torch.full((4,), float(rank + 1))
    b.all_reduce(t, ReduceOp.SUM, issued("all_reduce", 0, time.monotonic() + 20))
    b.close()
    return t.tolist()


def reduce_with_the_roots_op(rank: int, world_size: int) -> list[float]:
    """Seed 003's reduce: the root (0) asks for MAX, the others pass the default SUM."""
    b = backend(rank, world_size, "rootop")
    t = torch.tensor([float(rank + 1), float(10 - rank)])
    b.reduce(t, ReduceOp.MAX if rank == 0 else ReduceOp.SUM, 0, issued("reduce", 0, time.monotonic() + 20))
    b.close()
    return t.tolist()


SHARED_SPECS = [(1000, torch.float32, "SUM"), (77, torch.float64, "MAX"),
                (5, torch.bfloat16, "AVG"), (1 << 18, torch.float32, "PREMUL_SUM")]


def _mapped_file(t: torch.Tensor) -> str:
    """The file backing the memory of ``t`` in /proc/self/maps ("" for anonymous memory)."""
    addr = t.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= addr < hi:
                return fields[5].strip() if len(fields) > 5 else ""
    return ""


def shared_tensors(rank: int, world_size: int, shm: bool) -> dict[str, Any]:
    """Allocate SHARED_SPECS' tensors with shared_tensor and all_reduce each twice with fresh
    random inputs; every input is also all_reduced as an ordinary tensor on the same backend.
    Returns both results, what backs each tensor's memory, whether it started zero-filled and
    whether the shared segments' names were still in /dev/shm once allocated."""
    b = backend(rank, world_size, f"shared-{shm}", SHM=shm)
    tensors = [b.shared_tensor(n, dtype) for n, dtype, _ in SHARED_SPECS]
    shared = b.transport.shared if isinstance(b.transport, ShmTransport) else None
    own = [] if shared is None else [s.segments[rank].name for s in shared._buffers]
    out: dict[str, Any] = {
        "files": [_mapped_file(t) for t in tensors],
        "zeros": [bool((t == 0).all()) for t in tensors],
        "names_left": [n for n in own if os.path.exists(f"/dev/shm/{n}")],
        "shapes": [(tuple(t.shape), t.dtype) for t in tensors],
    }
    seq = 0
    for it in range(2):
        for k, (t, (n, dtype, op)) in enumerate(zip(tensors, SHARED_SPECS, strict=True)):
            t.copy_(random_input(dtype, rank, 10 * k + it, n))
            private = t.clone()
            b.all_reduce(t, redop(op), issued("all_reduce", seq, time.monotonic() + 30))
            b.all_reduce(private, redop(op), issued("all_reduce", seq + 1, time.monotonic() + 30))
            seq += 2
            out[f"shared/{k}/{it}"], out[f"private/{k}/{it}"] = t.clone(), private
    b.close()
    return out


def shared_mismatch(rank: int, world_size: int) -> tuple[str, str]:
    """all_reduce #0 of a shared tensor, except on the last rank: an ordinary one."""
    b = backend(rank, world_size, "shared-mm", timeout_s=20)
    t = b.shared_tensor(64, torch.float32)
    if rank == world_size - 1:
        t = torch.zeros(64)
    try:
        b.all_reduce(t, ReduceOp.SUM, issued("all_reduce", 0, time.monotonic() + 10))
        b.barrier(issued("barrier", 1, time.monotonic() + 10))
    except Exception as exc:
        return type(exc).__name__, str(exc)
    finally:
        b.close()
    return "no error", ""


def staged_plan(rank: int, world_size: int, nbytes: int) -> tuple[bool, int, int]:
    """all_reduce ``nbytes`` of float32; return (spread_out, chunk bytes, rounds) of its plan."""
    b = backend(rank, world_size, "plan", SHM_ONESHOT_BYTES=0)
    b.all_reduce(torch.ones(nbytes // 4), ReduceOp.SUM, issued("all_reduce", 0, time.monotonic() + 30))
    space = flat_space(b)
    assert space is not None
    _half, p = space._plans[("all_reduce", nbytes, 4)]  # the plan the all_reduce used
    b.close()
    return space.domain.spread_out, p.chunk_nbytes, len(p.chunks)


def group_shared_tensor(rank: int, world_size: int, shm: bool) -> dict[str, Any]:
    """Through the facade: what the world group declares (ProcessGroup.shares_memory), where
    its shared_tensor lives, and an all_reduce of it."""
    import ringtorch.distributed as dist

    os.environ["RINGTORCH_SHM"] = "1" if shm else "0"
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    group = dist.group.WORLD
    t = group.shared_tensor(1000, torch.float32)
    out: dict[str, Any] = {"shares": group.shares_memory, "file": _mapped_file(t),
                           "zeros": bool((t == 0).all())}
    t.copy_(torch.arange(1000, dtype=torch.float32) * (rank + 1))
    dist.all_reduce(t)
    out["sum"] = t
    dist.destroy_process_group()
    return out


def frozen_peer(rank: int, world_size: int, folder: str) -> dict[str, Any]:
    """Rank 1 writes its pid and waits for "go" (the test stops it with SIGSTOP meanwhile, and
    lets it go on once rank 0 has logged two stall warnings); rank 0 runs all_reduce #2 with a
    30 s deadline and records the warnings it logs while it waits (RINGTORCH_STALL_WARNING_S
    is 0.3 s)."""
    b = backend(rank, world_size, "frozen")
    b.broadcast(torch.zeros(4), 0, issued("broadcast", 1, time.monotonic() + 20))
    warnings: list[str] = []
    if rank == 1:
        # written whole, then renamed: the test reads it as soon as the name appears
        with open(os.path.join(folder, "pid1.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.rename(os.path.join(folder, "pid1.tmp"), os.path.join(folder, "pid1"))
        wait_for(lambda: os.path.exists(os.path.join(folder, "go")), timeout=60,
                 what="the test's go")
    else:
        class Record(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                warnings.append(record.getMessage())
                if len(warnings) == 2:
                    open(os.path.join(folder, "warned"), "w").close()

        handler = Record(level=logging.WARNING)
        logging.getLogger("ringtorch._wire.shm_domain").addHandler(handler)
    t = torch.full((4,), float(rank + 1))
    b.all_reduce(t, ReduceOp.SUM, issued("all_reduce", 2, time.monotonic() + 30))
    b.close()
    return {"sum": t.tolist(), "warnings": warnings}

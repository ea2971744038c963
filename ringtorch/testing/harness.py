"""Run a function on N real processes and collect every rank's result in the caller.

Tests drive ranks from the test process (Ray's style), not through exit codes: ``run_ranks``
starts ``world_size`` processes, calls ``fn(rank, world_size, *args)`` in each, and returns the
list of results in rank order. The first rank that raises makes ``run_ranks`` kill the others
and raise :class:`RankFailed` with that rank's traceback; a run past ``timeout`` kills every
rank and raises :class:`RanksTimedOut` naming the ranks that had not finished. Nothing hangs.

Processes come from a forkserver that has already imported torch, numpy and ringtorch, so a
world starts in tens of milliseconds instead of a second and a half per rank; on 2 cores,
process start-up is the test budget. Each rank gets the torch-style environment (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT on a fresh free port, drawn
below the ephemeral range: see :func:`job_port`) plus any ``env`` the caller gives.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import random
import signal
import socket
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ringtorch._wire.sockets import free_port

_PORT_FLOOR = 20000  # job ports are drawn from [_PORT_FLOOR, the ephemeral range's start)
_port_rng = random.SystemRandom()  # not the `random` a test may have seeded
# torch.optim comes with torch, but an optimizer's constructor imports torch._dynamo (about
# 1.5 s): preloaded, ranks that build optimizers start as fast as the others.
_PRELOAD = ["numpy", "torch", "torch.optim", "torch._dynamo", "ringtorch",
            "ringtorch.testing.harness"]
_context: Any = None


class RankFailed(RuntimeError):
    """A rank raised or died; ``rank`` and ``remote_traceback`` say which and why."""

    def __init__(self, rank: int, remote_traceback: str) -> None:
        super().__init__(f"rank {rank} failed:\n{remote_traceback}")
        self.rank = rank
        self.remote_traceback = remote_traceback


class RanksTimedOut(RuntimeError):
    """Some ranks did not finish in time; ``ranks`` lists them."""

    def __init__(self, ranks: list[int], timeout: float) -> None:
        super().__init__(f"ranks {ranks} did not finish within {timeout} s (killed)")
        self.ranks = ranks


def _mp_context() -> Any:
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)
        _context = ctx
    return _context


def _child_main(conn: Any, fn: Callable[..., Any], rank: int, world_size: int,
                args: Sequence[Any], env: Mapping[str, str]) -> None:
    os.environ.update(env)
    try:
        result = fn(rank, world_size, *args)
        payload = pickle.dumps(("ok", result), protocol=5)
    except BaseException:  # every failure goes back to the driver
        payload = pickle.dumps(("error", traceback.format_exc()), protocol=5)
    try:
        conn.send_bytes(payload)
    finally:
        conn.close()


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def job_port_range() -> tuple[int, int]:
    """The range ``[low, high)`` that :func:`job_port` draws from in this process.

    Below the kernel's ephemeral range; under pytest-xdist (``PYTEST_XDIST_WORKER=gwN``, the
    N-th of ``PYTEST_XDIST_WORKER_COUNT`` workers, inherited by the processes a test starts)
    the N-th slice of it, so that tests running at once on different workers never draw the
    same port.
    """
    low, high = _PORT_FLOOR, _ephemeral_start()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()):
        return low, high
    index, workers = int(worker[2:]), int(count)
    if workers < 2 or index >= workers:
        return low, high
    width = (high - low) // workers
    return low + index * width, low + (index + 1) * width


def job_port(host: str = "127.0.0.1") -> int:
    """A free port for a job's master to bind a moment later (MASTER_PORT, tcp://, ringrun).

    Drawn at random from :func:`job_port_range`, below the kernel's ephemeral range: a port
    that ``bind(0)`` returned is an ephemeral one, which any outgoing connection of any process
    (the suite makes thousands) may take as its source port before the master binds it, and the
    master then fails with "address in use". Below that range only a process choosing the same
    port on purpose can collide, and xdist's workers draw from slices of their own. Falls back
    to :func:`free_port` where the range leaves no room.
    """
    low, high = job_port_range()
    if high - low < 1000:
        return free_port(host)
    for _ in range(100):
        port = _port_rng.randrange(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    return free_port(host)


def rank_env(rank: int, world_size: int, master_port: int,
             extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The torch-style environment a launcher gives rank ``rank``."""
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
    }
    env.update(extra or {})
    return env


def run_ranks(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (),
              timeout: float = 60.0, env: Mapping[str, str] | None = None) -> list[Any]:
    """Call ``fn(rank, world_size, *args)`` on ``world_size`` processes; return the results.

    ``fn`` must be importable by name (a module-level function), and its arguments and
    results picklable.

    Raises:
        RankFailed: a rank raised (its traceback is in the message) or died without a result.
        RanksTimedOut: some ranks were still running after ``timeout`` seconds.
    """
    ctx = _mp_context()
    port = job_port()
    procs, conns = [], []
    for rank in range(world_size):
        parent_end, child_end = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_child_main,
            args=(child_end, fn, rank, world_size, tuple(args),
                  rank_env(rank, world_size, port, env)),
            name=f"rank{rank}",
        )
        proc.start()
        child_end.close()
        procs.append(proc)
        conns.append(parent_end)
    try:
        return _collect(procs, conns, timeout)
    finally:
        _kill_all(procs)
        for conn in conns:
            conn.close()


def _collect(procs: list[Any], conns: list[Any], timeout: float) -> list[Any]:
    deadline = time.monotonic() + timeout
    results: list[Any] = [None] * len(procs)
    pending = dict(enumerate(conns))
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RanksTimedOut(sorted(pending), timeout)
        ready = multiprocessing.connection.wait(list(pending.values()), timeout=remaining)
        for conn in ready:
            rank = next(r for r, c in pending.items() if c is conn)
            del pending[rank]
            status, value = _receive(conn, procs[rank])
            if status == "error":
                raise RankFailed(rank, value + _other_failures(pending, procs))
            results[rank] = value
    return results


def _receive(conn: Any, proc: Any) -> tuple[str, Any]:
    """A rank's (status, result or traceback); a rank that died without one is an error."""
    try:
        status, value = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        proc.join(1.0)
        return "error", f"process exited with code {proc.exitcode} without a result"
    return status, value


def _other_failures(pending: dict[int, Any], procs: list[Any], grace_s: float = 2.0) -> str:
    """What the ranks still running report within ``grace_s``, when they fail too: the first
    failure received is not always the cause (a rank that saw a peer die may report first)."""
    deadline = time.monotonic() + grace_s
    found = []
    while pending and (remaining := deadline - time.monotonic()) > 0:
        for conn in multiprocessing.connection.wait(list(pending.values()), timeout=remaining):
            rank = next(r for r, c in pending.items() if c is conn)
            del pending[rank]
            status, value = _receive(conn, procs[rank])
            if status == "error":
                found.append(f"\n(rank {rank} failed too:)\n{value}")
    return "".join(found)


def _kill_all(procs: list[Any]) -> None:
    for proc in procs:
        if proc.is_alive():
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for proc in procs:
        proc.join(5.0)

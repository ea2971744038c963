"""The RPC listener under hostile or careless input before authentication: a flood of idle
connections keeps its threads bounded, running out of file descriptors pauses accepting
(logged) instead of spinning a core, and a connection claiming to be a worker that is already
connected is refused loudly, the job going on unharmed.

Each scenario (the code every rank runs) sits above the tests that read its results; events
are ordered by the agent's ``statistics()``; every address is loopback.
"""

from __future__ import annotations

import functools
import logging
import os
import resource
import socket
import threading
import time
from typing import Any

import ringtorch.distributed.rpc as rpc
from ringtorch._wire.handshake import SERVICE_RPC, client_handshake, handshake_deadline
from ringtorch.distributed.rpc._mesh import MAX_HANDSHAKES_IN_FLIGHT, handshake_info
from ringtorch.testing import run_ranks
from tests.integration._rpc_common import add, agent_statistics, start, wait_until

NO_SECRET = {"RINGTORCH_SECRET": "", "RINGTORCH_SECRET_FILE": ""}


class _Log(logging.Handler):
    """Keeps the records of the RPC logger."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        logging.getLogger("ringtorch.distributed.rpc").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self, level: str) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelname == level]


def idle_flood(rank: int, ws: int, count: int) -> dict[str, Any]:
    """``count`` idle connections to this worker's own listener; the thread count is sampled
    as they arrive and once the listener has dropped all it must."""
    start(rank, ws)
    address = agent_statistics().address
    before = threading.active_count()
    peak = before
    strangers = []
    for i in range(count):
        strangers.append(socket.create_connection(("127.0.0.1", address["port"]), timeout=10))
        if i % 20 == 0:
            peak = max(peak, threading.active_count())
    must_drop = count - MAX_HANDSHAKES_IN_FLIGHT
    dropped = wait_until(lambda: agent_statistics().dropped_connections.get(
        "handshake slots full", 0) >= must_drop, 60)
    peak = max(peak, threading.active_count())
    stats = agent_statistics()
    out = {"before": before, "peak": peak, "dropped": dropped, "stats": stats,
           "works": rpc.rpc_sync(f"worker{rank}", add, args=(2, 3))}
    for sock in strangers:
        sock.close()
    rpc.shutdown()
    return out


@functools.cache
def flooded() -> dict[str, Any]:
    return run_ranks(idle_flood, 1, args=(1000,), timeout=120)[0]


def test_a_thousand_idle_connections_keep_the_listener_threads_bounded() -> None:
    out = flooded()
    assert out["dropped"], out["stats"]
    assert out["stats"].handshakes_in_flight == MAX_HANDSHAKES_IN_FLIGHT
    assert out["peak"] - out["before"] <= MAX_HANDSHAKES_IN_FLIGHT + 16, out
    assert out["works"] == 5
    print(f"1000 idle connections: {out['before']} threads before, at most {out['peak']} "
          f"during; {out['stats'].dropped_connections} dropped")


def out_of_descriptors(rank: int, ws: int) -> dict[str, Any]:
    """Make 60 sockets, lower RLIMIT_NOFILE to leave 5 descriptors free, then connect them to
    this worker's own listener: its accepts fail with EMFILE while connections wait.

    The secret comes from the environment: with only the secret file, each handshake opens it,
    and a handshake thread that takes the last descriptor first fails (freeing it) where the
    accept should; under load that order won and the accepts paused once only."""
    log = _Log()
    os.environ["RINGTORCH_SECRET"] = "out-of-descriptors test"
    start(rank, ws)
    port = agent_statistics().address["port"]
    clients = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(60)]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 6, hard))
    try:
        for sock in clients:
            sock.connect(("127.0.0.1", port))
        paused = wait_until(lambda: agent_statistics().accept_pauses >= 1, 30)
        wall, cpu = time.monotonic(), time.process_time()
        more = wait_until(lambda: agent_statistics().accept_pauses >= 4, 30)
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    finally:
        for sock in clients:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    out = {"paused": paused, "more": more, "wall": wall, "cpu": cpu,
           "errors": log.lines("ERROR"), "stats": agent_statistics(),
           "works": rpc.rpc_sync(f"worker{rank}", add, args=(4, 5))}
    rpc.shutdown()
    return out


def test_running_out_of_descriptors_pauses_accepting_with_a_logged_error() -> None:
    out = run_ranks(out_of_descriptors, 1, timeout=120)[0]
    assert out["paused"] and out["more"], out
    assert len(out["errors"]) == 1, out["errors"]
    assert out["errors"][0].startswith(
        "ringtorch RPC: cannot accept connections: [Errno 24] Too many open files; ")
    assert "pausing accepts for up to 1.0 s at a time until descriptors are free again" in (
        out["errors"][0])
    # Pauses of 0.05, 0.1 and 0.2 s at least: a loop spinning on the error would burn a core.
    assert out["wall"] >= 0.3 and out["cpu"] < 0.5 * out["wall"], out
    assert out["works"] == 9
    print(f"out of descriptors: {out['stats'].accept_pauses} pauses, {out['cpu']:.3f} s CPU "
          f"over {out['wall']:.2f} s")


def impostor(rank: int, ws: int) -> dict[str, Any]:
    """With no job secret at all, a process on the host connects to worker 0 claiming to be
    worker 1, which is already connected: it is refused, loudly, and the job goes on."""
    log = _Log()
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        address = agent_statistics().address
        sock = socket.create_connection(("127.0.0.1", address["port"]), timeout=10)
        try:
            client_handshake(sock, SERVICE_RPC, handshake_deadline(), "worker0's listener",
                             handshake_info("worker1", 1), use_env_secret=False)
            out["impostor"] = ("accepted", "")
        except Exception as exc:
            out["impostor"] = (type(exc).__name__, str(exc))
        out["closed"] = sock.recv(1) == b""
        sock.close()
        # the listener counts the refusal once its handshake thread is back from sending it
        wait_until(lambda: agent_statistics().refused_connections >= 1)
        out["errors"] = log.lines("ERROR")
    out["calls"] = rpc.rpc_sync(f"worker{1 - rank}", add, args=(rank, 10))
    out["refused"] = agent_statistics().refused_connections
    rpc.shutdown()
    return out


def test_a_connection_claiming_to_be_a_connected_worker_is_refused_loudly() -> None:
    first, second = run_ranks(impostor, 2, env=NO_SECRET, timeout=60)
    assert first["impostor"] == (
        "HandshakeError", "worker0's listener refused the connection: worker 'worker1' "
                          "(rank 1) is already connected to worker 'worker0' (rank 0)")
    assert first["closed"]
    assert len(first["errors"]) == 1
    assert first["errors"][0].startswith(
        "ringtorch RPC: refused a second connection claiming to be worker 'worker1' (rank 1) "
        "from 127.0.0.1:")
    assert first["errors"][0].endswith(
        ": that worker is already connected to worker 'worker0' (rank 0); its connection is "
        "kept")
    assert (first["refused"], second["refused"]) == (1, 0)
    assert (first["calls"], second["calls"]) == (10, 11)  # both directions still work

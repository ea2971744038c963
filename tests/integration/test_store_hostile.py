"""A TCPStore server under floods of strangers and slow clients, before and after they
authenticate: legitimate clients still get through, and the memory the server holds for
partial requests stays under its cap (RINGTORCH_STORE_MAX_BUFFERED_BYTES).

Every event is ordered by the server's ``statistics()`` (waits on its state, never sleeps);
the legitimate clients are other processes; every address is loopback.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from ringtorch import _config
from ringtorch._wire.handshake import SERVICE_STORE, client_handshake, handshake_deadline
from ringtorch.store import _protocol as P
from ringtorch.store import _tcp_admission
from ringtorch.store._tcp_admission import (
    DROPPED_SLOWEST,
    MAX_HANDSHAKES_IN_FLIGHT,
    StoreServerStatistics,
)
from ringtorch.store._tcp_server import StoreServer
from ringtorch.testing import wait_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# 24 clients, each in a thread of one other process: connect (TCPStore's own retry included),
# set a key, read back every key once all are set; report what each saw.
LEGITIMATE_CLIENTS = r"""
import json, sys, threading, time
from datetime import timedelta
from ringtorch.store import TCPStore
port, n = int(sys.argv[1]), int(sys.argv[2])
results = [None] * n
def client(i):
    start = time.monotonic()
    try:
        store = TCPStore("127.0.0.1", port, timeout=timedelta(seconds=20))
        store.set(f"client{i}", str(i))
        store.wait([f"client{j}" for j in range(n)])
        got = [store.get(f"client{j}").decode() for j in range(n)]
        results[i] = ["ok", got == [str(j) for j in range(n)], time.monotonic() - start]
        store.close()
    except Exception as exc:
        results[i] = [type(exc).__name__, str(exc), time.monotonic() - start]
threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(results))
"""


@pytest.fixture
def server():
    srv = StoreServer("127.0.0.1", 0).start()
    yield srv
    srv.close()


def _idle(port: int) -> socket.socket:
    """A stranger: connects and never says a word."""
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _authenticated(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    client_handshake(sock, SERVICE_STORE, handshake_deadline(), "the test server")
    sock.settimeout(5.0)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_idle_strangers_filling_every_handshake_slot_do_not_lock_clients_out(server):
    port = server.port
    strangers = [_idle(port) for _ in range(200)]
    wait_for(lambda: server.statistics().dropped.get("handshake slots full", 0) >= 200 -
             MAX_HANDSHAKES_IN_FLIGHT, 30, "the oldest strangers to be dropped")
    assert server.statistics().handshakes_in_flight == MAX_HANDSHAKES_IN_FLIGHT
    stop = threading.Event()
    more: list[socket.socket] = []

    def keep_flooding() -> None:  # bounded: at most 400 more, for at most 30 s
        end = time.monotonic() + 30
        while not stop.is_set() and len(more) < 400 and time.monotonic() < end:
            more.append(_idle(port))
            stop.wait(0.005)

    flood = threading.Thread(target=keep_flooding)
    flood.start()
    try:
        proc = subprocess.run([sys.executable, "-c", LEGITIMATE_CLIENTS, str(port), "24"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        stop.set()
        flood.join()
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    stats = server.statistics()
    for sock in strangers + more:
        sock.close()
    assert [r[:2] for r in results] == [["ok", True]] * 24, results
    assert max(r[2] for r in results) < 20
    assert stats.handshakes_in_flight <= MAX_HANDSHAKES_IN_FLIGHT
    assert stats.dropped["handshake slots full"] >= 200 - MAX_HANDSHAKES_IN_FLIGHT
    print(f"legitimate clients: 24/24 connected during the flood of {200 + len(more)} "
          f"strangers; slowest {max(r[2] for r in results):.2f} s; "
          f"{stats.dropped['handshake slots full']} strangers dropped")


def test_a_dropped_stranger_is_shut_down_and_the_drop_is_logged(server, caplog):
    caplog.set_level(logging.WARNING, logger="ringtorch.store")
    first = _idle(server.port)
    wait_for(lambda: server.statistics().handshakes_in_flight == 1, 30, "the first handshake")
    others = [_idle(server.port) for _ in range(MAX_HANDSHAKES_IN_FLIGHT)]
    assert _closed_by_server(first)  # the oldest made room for the newest
    assert server.statistics().dropped == {"handshake slots full": 1}
    assert re.search(r"TCPStore server on 127\.0\.0\.1:\d+: dropped 1 unauthenticated "
                     r"connection\(s\) still in their handshake to make room for new ones "
                     r"\(handshake slots full; latest 127\.0\.0\.1:\d+; 1 dropped so far\)",
                     caplog.text)
    for sock in others:
        sock.close()


CHUNK = 64 * 1024
FIRST = 96 * 1024  # the request head and the start of its body
CAP = 1024 * 1024


def _start_request(sock: socket.socket) -> None:
    """The head of a set announcing a 1 MiB body, and its first bytes: a partial request."""
    head = P.REQUEST_HEAD.pack(2 * 1024 * 1024, 1, P.OP_SET, 0, 2, 0, 0)
    sock.sendall(head + b"\0" * (FIRST - len(head)))


def test_slow_partial_requests_stay_under_the_cap_and_the_slowest_are_dropped(caplog):
    caplog.set_level(logging.WARNING, logger="ringtorch.store")
    with _config.override(STORE_MAX_BUFFERED_BYTES=CAP):
        server = StoreServer("127.0.0.1", 0).start()
    try:
        port = server.port
        slow = [_authenticated(port) for _ in range(4)]
        fast = [_authenticated(port) for _ in range(4)]
        wait_for(lambda: server.statistics().connections == 8, 30, "8 clients")

        def reaches(buffered: int, dropped: int) -> Callable[[], bool]:
            def check() -> bool:
                stats = server.statistics()
                return (stats.buffered_bytes, stats.dropped.get(DROPPED_SLOWEST, 0)) == (
                    buffered, dropped)
            return check

        expected = 0
        for sock in slow + fast:  # the slow ones first: they made progress least recently
            _start_request(sock)
            expected += FIRST
            wait_for(reaches(expected, 0), 30, f"{expected} bytes buffered")
        # Only the fast ones go on; the server drops the slow ones, the least recent first,
        # as soon as the total would pass the cap.
        order = list(slow)
        dropped = 0
        for _ in range(2):
            for sock in fast:
                sock.sendall(b"\0" * CHUNK)
                expected += CHUNK
                while expected > CAP:
                    order.pop(0)
                    expected -= FIRST
                    dropped += 1
                wait_for(reaches(expected, dropped), 30, f"{expected} bytes and {dropped} drops")
        stats = server.statistics()
        assert stats.peak_buffered_bytes <= CAP == stats.max_buffered_bytes
        assert dropped == 3 and order == slow[3:]
        for sock in slow[:3]:
            assert _closed_by_server(sock)
        for sock in slow[3:] + fast:
            sock.settimeout(0.0)
            with pytest.raises(BlockingIOError):  # open: nothing to read, not closed
                sock.recv(1)
        assert len(re.findall(r"closed the connection from 127\.0\.0\.1:\d+: partial requests "
                              r"hold \d+ bytes, at the cap of 1048576 "
                              r"\(RINGTORCH_STORE_MAX_BUFFERED_BYTES\), and its 98304-byte "
                              r"partial request made progress least recently", caplog.text)) == 3
        honest = subprocess.run([sys.executable, "-c", LEGITIMATE_CLIENTS, str(port), "1"],
                                cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert json.loads(honest.stdout)[0][:2] == ["ok", True], honest.stderr
        print(f"peak buffered {stats.peak_buffered_bytes} bytes under a cap of {CAP}; "
              f"{dropped} slowest clients dropped")
        for sock in slow + fast:
            sock.close()
    finally:
        server.close()


def test_one_partial_request_larger_than_the_cap_closes_its_connection(caplog):
    caplog.set_level(logging.WARNING, logger="ringtorch.store")
    with _config.override(STORE_MAX_BUFFERED_BYTES=CAP):
        server = StoreServer("127.0.0.1", 0).start()
    try:
        sock = _authenticated(server.port)
        _start_request(sock)
        wait_for(lambda: server.statistics().buffered_bytes == FIRST, 30, "the first bytes")
        try:
            sock.sendall(b"\0" * (CAP - FIRST + 1))
        except OSError:
            pass  # closed by the server before the last bytes were sent
        assert _closed_by_server(sock)
        stats: StoreServerStatistics = server.statistics()
        assert (stats.buffered_bytes, stats.dropped) == (0, {DROPPED_SLOWEST: 1})
        assert stats.peak_buffered_bytes <= CAP
        assert re.search(r"closed the connection from 127\.0\.0\.1:\d+: its partial request of "
                         r"\d+ bytes is over the cap of 1048576 bytes on partial requests "
                         r"\(RINGTORCH_STORE_MAX_BUFFERED_BYTES\)", caplog.text)
        sock.close()
    finally:
        server.close()


def test_a_client_whose_handshake_is_cut_short_tries_again_within_its_timeout():
    """The first connection of a client (another process) is accepted and closed before it
    is answered, as a flooded server drops it; the client tries again, and gets in."""
    door = socket.create_server(("127.0.0.1", 0))
    door.settimeout(60)
    port = door.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", LEGITIMATE_CLIENTS, str(port), "1"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first, _ = door.accept()
    first.settimeout(60)
    assert first.recv(4) == b"RTRC"  # its hello has come: it is in its handshake
    first.close()
    door.close()
    server = StoreServer("127.0.0.1", port).start()
    try:
        out, err = proc.communicate(timeout=60)
        assert json.loads(out)[0][:2] == ["ok", True], err
        assert server.statistics().refused_handshakes == 0
    finally:
        server.close()


def test_at_the_connection_cap_strangers_make_room_and_only_a_full_house_refuses(
        server, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="ringtorch.store")
    monkeypatch.setenv("RINGTORCH_STORE_MAX_CONNECTIONS", "6")  # a small house, same rules
    port = server.port
    members = [_authenticated(port) for _ in range(4)]
    wait_for(lambda: server.statistics().connections == 4, 30, "4 members")
    strangers = [_idle(port) for _ in range(2)]
    wait_for(lambda: server.statistics().handshakes_in_flight == 2, 30, "2 strangers")
    for n, stranger in enumerate(strangers, start=1):  # each newcomer takes a stranger's place
        members.append(_authenticated(port))
        assert _closed_by_server(stranger)
        wait_for(lambda n=n: server.statistics().connections == 4 + n, 30, f"{4 + n} members")
    refused = _idle(port)  # six members, no stranger left to drop: refused
    assert _closed_by_server(refused)
    stats = server.statistics()
    assert stats.dropped == {_tcp_admission.DROPPED_CONNECTIONS: 2,
                             _tcp_admission.REFUSED_CONNECTIONS: 1}
    assert re.search(r"TCPStore server on 127\.0\.0\.1:\d+: refused 127\.0\.0\.1:\d+: connection "
                     r"cap reached, no unauthenticated connection to drop", caplog.text)
    for sock in [*members, *strangers, refused]:
        sock.close()


STORE_OUT_OF_DESCRIPTORS = r"""
import json, logging, os, resource, socket, time
from datetime import timedelta
from ringtorch.store import TCPStore
from ringtorch.store._tcp_server import StoreServer
from ringtorch.testing import wait_for

errors = []
class Errors(logging.Handler):
    def emit(self, record):
        if record.levelname == "ERROR":
            errors.append(record.getMessage())
logging.getLogger("ringtorch.store").addHandler(Errors())
server = StoreServer("127.0.0.1", 0).start()

# 60 sockets made first; then 5 descriptors left: the server's accepts fail with EMFILE
# while the other connections wait in the backlog.
clients = [socket.socket() for _ in range(60)]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 6, hard))
for sock in clients:
    sock.connect(("127.0.0.1", server.port))
paused = wait_for(lambda: server.statistics().accept_pauses >= 1, 30, "a first pause")
wall, cpu = time.monotonic(), time.process_time()
more = wait_for(lambda: server.statistics().accept_pauses >= 4, 30, "3 more pauses")
wall, cpu = time.monotonic() - wall, time.process_time() - cpu
for sock in clients:
    sock.close()
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
store = TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=20))
store.set("k", "v")
print(json.dumps({"paused": paused, "more": more, "wall": wall, "cpu": cpu, "errors": errors,
                  "works": store.get("k").decode()}))
"""


def test_running_out_of_descriptors_pauses_the_store_accepting_with_a_logged_error():
    proc = subprocess.run([sys.executable, "-c", STORE_OUT_OF_DESCRIPTORS], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["paused"] and out["more"], out
    assert len(out["errors"]) == 1, out["errors"]
    assert re.match(r"TCPStore server on 127\.0\.0\.1:\d+: cannot accept connections: \[Errno "
                    r"24\] Too many open files; dropped the oldest unauthenticated connection, "
                    r"pausing accepts for up to 1\.0 s at a time until descriptors are free "
                    r"again", out["errors"][0])
    # Pauses of 0.05, 0.1 and 0.2 s at least: a loop spinning on the error would burn a core.
    assert out["wall"] >= 0.3 and out["cpu"] < 0.5 * out["wall"], out
    assert out["works"] == "v"

"""TCPStore between real processes: atomicity, blocking semantics, races, and faults.

The server must keep serving honest clients while others send garbage, half frames or the
wrong secret; a client must get an error, never a hang, when its server dies or hangs.
"""

from __future__ import annotations

import logging
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

from ringtorch import _config
from ringtorch._errors import DistNetworkError, DistStoreError
from ringtorch._wire.framing import recv_exactly
from ringtorch._wire.handshake import SERVICE_STORE, client_handshake, handshake_deadline
from ringtorch.store import StoreAddressInUseError, TCPStore
from ringtorch.store import _protocol as P
from ringtorch.store._tcp_master import bind_address
from ringtorch.testing import run_ranks, wait_for, wait_for_thread_in
from tests.integration import _store_ranks as ranks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T30 = timedelta(seconds=30)


@pytest.fixture
def master():
    store = TCPStore("127.0.0.1", 0, 1, True, T30)
    yield store
    store.close()


def test_four_processes_adding_to_one_key_get_the_exact_total():
    assert run_ranks(ranks.add_many, 4, args=(300, "tcp")) == [4 * 300] * 4


def test_get_and_wait_in_other_processes_block_until_the_keys_are_set():
    assert run_ranks(ranks.get_before_set, 3, args=("tcp",)) == [b"", b"from rank 0",
                                                                  b"from rank 0"]


def test_compare_set_race_has_exactly_one_winner():
    results = run_ranks(ranks.race_compare_set, 4, args=("tcp",))
    assert len(set(results)) == 1, results
    assert results[0] in {b"rank0", b"rank1", b"rank2", b"rank3"}


def test_wait_for_workers_times_out_naming_how_many_joined():
    started = time.monotonic()
    with pytest.raises(DistStoreError, match=r"^Timed out after 1 seconds waiting for clients\. "
                                             r"1/3 clients joined\.$"):
        TCPStore("127.0.0.1", 0, 3, True, timedelta(seconds=1))
    assert time.monotonic() - started < 10.0


def test_port_in_use_names_the_port(master):
    port = master.port
    with pytest.raises(StoreAddressInUseError, match=(
            rf"^The server socket has failed to listen on any local network address\. "
            rf"port: {port}, host: 127\.0\.0\.1: port {port} on 127\.0\.0\.1 is already in use")
    ) as info:
        TCPStore("127.0.0.1", port, 1, True, T30)
    assert isinstance(info.value, OSError) and isinstance(info.value, DistNetworkError)


def test_port_zero_picks_a_port_and_reports_it(master):
    assert 0 < master.port < 65536
    assert master.host == "127.0.0.1"
    client = TCPStore("127.0.0.1", master.port, None, False, T30)
    client.set("k", "v")
    assert master.get("k") == b"v"


def test_multi_tenant_masters_share_one_server(master):
    first = TCPStore("127.0.0.1", 0, 1, True, T30, multi_tenant=True)
    second = TCPStore("127.0.0.1", first.port, 1, True, T30, multi_tenant=True)
    first.set("shared", "yes")
    assert second.get("shared") == b"yes"
    first.close()
    assert second.get("shared") == b"yes"  # the server lives while one tenant does
    second.close()


def test_a_client_with_the_wrong_port_fails_within_its_timeout_naming_host_and_port():
    from ringtorch.testing import free_port

    port = free_port()
    started = time.monotonic()
    with pytest.raises(DistNetworkError, match=rf"^TCPStore client could not connect to "
                                               rf"127\.0\.0\.1:{port} within 0:00:00.500000"):
        TCPStore("127.0.0.1", port, None, False, timedelta(milliseconds=500))
    assert time.monotonic() - started < 5.0


def test_the_timeout_error_says_how_long_it_tried_and_the_last_error():
    from ringtorch.testing import free_port

    port = free_port()
    with pytest.raises(DistNetworkError, match=rf"127\.0\.0\.1:{port}: no server accepted the "
                                               rf"connection in 0\.[5-9] s \(last error: "
                                               rf"\[Errno 111\] Connection refused\)"):
        TCPStore("127.0.0.1", port, None, False, timedelta(milliseconds=500))


def test_a_client_whose_store_never_starts_says_so_on_stderr_long_before_its_timeout(tmp_path):
    """Nobody listens on the port: within seconds, not at the 30 s timeout, the process's
    stderr names the address, the seconds waited and the refused connection, again as the
    wait doubles."""
    from ringtorch.testing import free_port

    port, err = free_port(), tmp_path / "stderr"
    code = ("from datetime import timedelta\nfrom ringtorch.store import TCPStore\n"
            f"TCPStore('127.0.0.1', {port}, None, False, timedelta(seconds=30))\n")
    line = re.compile(rf"^TCPStore client: still connecting to 127\.0\.0\.1:{port}, "
                      rf"(\d+\.\d) s so far \(last error: \[Errno 111\] Connection refused\); "
                      rf"retrying until the timeout \(0:00:30\)", re.M)
    started = time.monotonic()
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stderr=stderr)
    try:
        waited = wait_for(lambda: [float(w) for w in line.findall(err.read_text())][:2] if
                          len(line.findall(err.read_text())) >= 2 else None, timeout=20.0,
                          what="two 'still connecting' warnings")
        assert proc.poll() is None  # still trying: the warnings came before the timeout
    finally:
        proc.kill()
        proc.wait()
    assert 1.0 <= waited[0] < 2.0 <= waited[1] < 4.0, waited
    assert time.monotonic() - started < 25.0


def test_oversized_values_are_refused_naming_the_key():
    with _config.override(STORE_MAX_VALUE_BYTES=1000):
        store = TCPStore("127.0.0.1", 0, 1, True, T30)
    with pytest.raises(ValueError, match=r"^value for key 'big' is 1001 bytes; TCPStore values "
                                         r"are at most 1000 bytes"):
        store.set("big", b"x" * 1001)
    store.set("ok", b"x" * 1000)
    assert store.get("ok") == b"x" * 1000
    store.close()


def test_large_values_round_trip(master):
    value = os.urandom(3 * 1024 * 1024)
    master.set("big", value)
    assert master.get("big") == value
    assert master.multi_get(["big", "big"]) == [value, value]


def test_values_are_never_unpickled(master, tmp_path):
    canary = tmp_path / "canary"

    class Boom:
        def __reduce__(self):
            return (open, (str(canary), "w"))

    payload = pickle.dumps(Boom())
    master.set("evil", payload)
    assert master.get("evil") == payload
    assert master.compare_set("evil", payload, payload) == payload
    assert not canary.exists()


def test_store_and_rendezvous_sources_import_no_deserializer():
    sources = [os.path.join(ROOT, "ringtorch", "rendezvous.py")] + [
        os.path.join(ROOT, "ringtorch", "store", name)
        for name in os.listdir(os.path.join(ROOT, "ringtorch", "store")) if name.endswith(".py")]
    pattern = re.compile(r"^\s*(import|from)\s+(pickle|marshal|dill|cloudpickle)\b|\beval\(",
                         re.M)
    offenders = [path for path in sources if pattern.search(open(path).read())]
    assert offenders == []


def _raw_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    client_handshake(sock, SERVICE_STORE, handshake_deadline(), "test server")
    sock.settimeout(5.0)
    return sock


def _request(op: int, fields: list[bytes], rid: int = 7, tmo: int = 0, arg: int = 0) -> bytes:
    body = b"".join(P.encode_fields(fields))
    return P.REQUEST_HEAD.pack(len(body), rid, op, 0, len(fields), tmo, arg) + body


def _closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_server_closes_bad_connections_and_keeps_serving_the_others(caplog):
    caplog.set_level(logging.WARNING, logger="ringtorch.store")
    with _config.override(HANDSHAKE_TIMEOUT=1.0):
        store = TCPStore("127.0.0.1", 0, 1, True, T30)
        port = store.port
        store.set("kept", "value")
        garbage = socket.create_connection(("127.0.0.1", port), timeout=5)
        garbage.sendall(b"GET / HTTP/1.1\r\nHost: example.org\r\nUser-Agent: scanner\r\n\r\n")
        huge = _raw_client(port)
        huge.sendall(P.REQUEST_HEAD.pack(2**32 - 1, 1, P.OP_SET, 0, 2, 0, 0))
        unknown = _raw_client(port)
        unknown.sendall(_request(99, []))
        lying = _raw_client(port)
        lying.sendall(P.REQUEST_HEAD.pack(8, 1, P.OP_GET, 0, 1, 0, 0) + P.FIELD_LENGTH.pack(5000)
                      + b"kept")
        half = _raw_client(port)
        half.sendall(_request(P.OP_SET, [b"kept", b"clobbered"])[:30])
        for sock in (garbage, huge, unknown, lying, half):
            assert _closed_by_server(sock)
        store.set("during", "ok")
        assert store.get("kept") == b"value"
        assert store.get("during") == b"ok"
        honest = _raw_client(port)
        honest.sendall(_request(P.OP_GET, [b"kept"]))
        answer = bytes(recv_exactly(honest, P.RESPONSE_HEAD.size + 9))
    assert answer == P.RESPONSE_HEAD.pack(9, 7, P.STATUS_OK, 0, 1, 0) + b"\x05\x00\x00\x00value"
    log = caplog.text
    assert "auth failed from 127.0.0.1:" in log and "does not speak the ringtorch protocol" in log
    assert "unknown op 99" in log and "over the cap" in log and "do not add up" in log
    assert "silent for" in log
    for sock in (garbage, huge, unknown, lying, half, honest):
        sock.close()
    store.close()


def test_wrong_secret_clients_are_refused_and_the_server_keeps_serving(caplog):
    caplog.set_level(logging.WARNING, logger="ringtorch.store")
    with _config.override(SECRET="right secret"):
        store = TCPStore("127.0.0.1", 0, 1, True, T30)
        store.set("k", "v")
        wrong, none, right = (run_ranks(ranks.connect_and_report, 1, env={
            "MASTER_PORT": str(store.port), "RINGTORCH_SECRET": secret,
            "RINGTORCH_SECRET_FILE": ""})[0]  # no secret at all when RINGTORCH_SECRET is empty
            for secret in ("wrong secret", "", "right secret"))
        assert store.get("k") == b"v"
    assert re.match(r"^HandshakeError: 127\.0\.0\.1:\d+ failed to prove the job secret: "
                    r"RINGTORCH_SECRET differs between this process and the server$", wrong)
    assert re.match(r"^HandshakeError: 127\.0\.0\.1:\d+ requires a job secret and this process "
                    r"has none: set RINGTORCH_SECRET", none)
    assert right == "connected"
    assert "auth failed from 127.0.0.1:" in caplog.text
    store.close()


def _start_standalone(*extra: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "ringtorch.store", "--port", "0",
                             "--host", "127.0.0.1", *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    match = re.match(r"^ringtorch store listening on 127\.0\.0\.1:(\d+)$", line.strip())
    assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, int(match.group(1))


def test_standalone_server_serves_until_sigterm():
    proc, port = _start_standalone()
    client = TCPStore("127.0.0.1", port, None, False, T30)
    client.set("k", "v")
    assert TCPStore("127.0.0.1", port, None, False, T30).get("k") == b"v"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and out.strip() == "ringtorch store stopped"


def test_client_of_a_dead_server_gets_an_error_not_a_hang():
    proc, port = _start_standalone()
    waiter = TCPStore("127.0.0.1", port, None, False, T30)
    other = TCPStore("127.0.0.1", port, None, False, T30)
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _record(errors, lambda: waiter.get("never")))
    thread.start()
    wait_for_thread_in(thread, "_recv_answer")  # the get reached the server and waits
    started = time.monotonic()
    proc.kill()
    proc.wait()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - started < 5.0
    assert isinstance(errors[0], DistNetworkError)
    assert re.match(rf"^lost the connection to TCPStore 127\.0\.0\.1:{port} ", str(errors[0]))
    with pytest.raises(DistNetworkError, match=rf"TCPStore 127\.0\.0\.1:{port}"):
        other.add("k", 1)


def test_client_of_a_hung_server_gets_an_error_within_its_timeout():
    proc, port = _start_standalone()
    client = TCPStore("127.0.0.1", port, None, False, timedelta(milliseconds=500))
    os.kill(proc.pid, signal.SIGSTOP)
    # kill() returns before the process has stopped
    wait_for(lambda: open(f"/proc/{proc.pid}/stat").read().split(") ")[1][0] == "T",
             what="the server to stop")
    try:
        started = time.monotonic()
        with pytest.raises(DistStoreError, match=rf"^TCPStore 127\.0\.0\.1:{port} did not "
                                                 rf"answer within 0:00:01(\.0+)?: the server is "
                                                 rf"hung or unreachable$"):
            client.add("k", 1)
        assert time.monotonic() - started < 5.0
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def _record(errors: list[BaseException], fn) -> None:
    try:
        fn()
    except BaseException as exc:
        errors.append(exc)


def test_a_forked_child_reconnects_and_leaves_the_parents_stream_alone(master):
    master.set("k", "parent")
    pid = os.fork()
    if pid == 0:  # child: use the inherited client hard, then leave without cleanup
        code = 1
        try:
            for _ in range(200):
                master.add("child_adds", 1)
                assert master.get("k") == b"parent"
            code = 0
        finally:
            os._exit(code)
    for _ in range(200):
        master.add("parent_adds", 1)
        assert master.get("k") == b"parent"
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert master.get("child_adds") == b"200" and master.get("parent_adds") == b"200"


def test_clients_from_external_processes_meet_at_a_store_hosted_here(master):
    master.set("greeting", "welcome")
    assert run_ranks(ranks.client_of_external_store, 2,
                     env={"MASTER_PORT": str(master.port)}) == [b"welcome", b"welcome"]
    assert master.check(["hello/0", "hello/1"])


@pytest.mark.parametrize("host, bound", [("127.0.0.1", "127.0.0.1"), ("localhost", "127.0.0.1"),
                                         ("10.1.2.3", "0.0.0.0"), ("0.0.0.0", "0.0.0.0")])
def test_a_loopback_master_listens_on_loopback_only(host, bound):
    assert bind_address(host) == bound


def test_binding_every_interface_without_a_secret_warns_loudly(caplog):
    caplog.set_level(logging.WARNING, logger="ringtorch.store")
    with _config.override(SECRET="", SECRET_FILE=""):  # no secret at all
        store = TCPStore("0.0.0.0", 0, 1, True, T30)
    assert "WITHOUT a job secret" in caplog.text and f"0.0.0.0:{store.port}" in caplog.text
    store.close()
    for secret in ({"SECRET": "s"}, {"SECRET": ""}):  # RINGTORCH_SECRET, or the secret file
        caplog.clear()
        with _config.override(**secret):
            store = TCPStore("0.0.0.0", 0, 1, True, T30)
            store.close()
        assert "WITHOUT" not in caplog.text


def test_a_get_blocked_in_a_thread_returns_when_another_client_sets_the_key(master):
    master.set_timeout(timedelta(seconds=5))
    results: list[bytes] = []
    getter = threading.Thread(target=lambda: results.append(master.get("later")))
    getter.start()
    wait_for_thread_in(getter, "_recv_answer")  # the get reached the server and waits
    setter = TCPStore("127.0.0.1", master.port, None, False, T30)
    setter.set("later", "now")
    getter.join(5)
    assert results == [b"now"]


def test_a_parked_multi_get_answers_only_when_every_key_is_there_at_once(master):
    # The server remembers how far a parked request's keys were found, so that thousands of
    # keys arriving one by one are not scanned again at each arrival; a key found earlier and
    # deleted since must still hold the answer back.
    master.set_timeout(timedelta(seconds=10))
    results: list[list[bytes]] = []
    keys = [f"m{i}" for i in range(4)]
    getter = threading.Thread(target=lambda: results.append(master.multi_get(keys)))
    getter.start()
    wait_for_thread_in(getter, "_recv_answer")
    setter = TCPStore("127.0.0.1", master.port, None, False, T30)
    setter.set("m0", "0")
    setter.set("m1", "1")
    assert setter.delete_key("m0")  # found, then gone again
    setter.set("m2", "2")
    setter.set("m3", "3")
    assert setter.check(["m3"]) and getter.is_alive()  # the server has seen every set
    setter.set("m0", "again")
    getter.join(10)
    assert results == [[b"again", b"1", b"2", b"3"]]
    setter.close()


def test_clients_asking_for_the_same_hundreds_of_keys_each_get_the_values_they_asked_for(
        master):
    # At a job's start every rank asks for the same long list of keys; the server decodes
    # such a list once. Two lists of the same size but other keys must not be confused.
    master.set_timeout(timedelta(seconds=10))
    ranks = [f"default_pg/0//rank/{i:03d}" for i in range(300)]  # 8 KB of keys
    hosts = [f"default_pg/0//host/{i:03d}" for i in range(300)]  # as many bytes
    master.multi_set(ranks, [f"r{i}" for i in range(300)])
    master.multi_set(hosts[:-1], [f"h{i}" for i in range(299)])
    clients = [TCPStore("127.0.0.1", master.port, None, False, T30) for _ in range(3)]
    results: dict[int, list[bytes]] = {}
    getters = [threading.Thread(target=lambda i=i: results.__setitem__(
        i, clients[i].multi_get(hosts))) for i in range(2)]
    for getter in getters:
        getter.start()
        wait_for_thread_in(getter, "_recv_answer")  # parked: the last host key is missing
    assert clients[2].multi_get(ranks) == [f"r{i}".encode() for i in range(300)]
    master.set(hosts[-1], "h299")
    for getter in getters:
        getter.join(10)
    assert results == {i: [f"h{j}".encode() for j in range(300)] for i in range(2)}
    assert clients[2].multi_get(ranks) == [f"r{i}".encode() for i in range(300)]
    for client in clients:
        client.close()


FORKING_MASTER = r"""
import os, sys, time
from datetime import timedelta
from ringtorch.store import TCPStore
store = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30))
print(store.port, flush=True)
store.wait(["client connected"])
if os.fork() == 0:  # a child (a data loader worker, say) that outlives its parent a while
    time.sleep(40)
    os._exit(0)
print("forked", flush=True)
time.sleep(60)
"""


def test_a_forked_child_of_the_master_does_not_keep_connections_alive_after_it_dies():
    proc = subprocess.Popen([sys.executable, "-c", FORKING_MASTER], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    client = TCPStore("127.0.0.1", port, None, False, T30)
    client.set("client connected", "yes")
    assert proc.stdout.readline() == "forked\n"
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _record(errors, lambda: client.get("never")))
    thread.start()
    wait_for_thread_in(thread, "_recv_answer")  # the get reached the master and waits
    started = time.monotonic()
    proc.kill()
    proc.wait()
    thread.join(10)
    # The child lives 40 s more: an error well before that came from the master's death.
    assert time.monotonic() - started < 20.0, "the child's copies kept the connection open"
    assert isinstance(errors[0], DistNetworkError)


def test_a_signal_during_a_blocking_get_does_not_break_it(master):
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: received.append(True))
    try:
        setter = TCPStore("127.0.0.1", master.port, None, False, T30)
        def signal_then_set() -> None:
            wait_for_thread_in(threading.main_thread(), "_recv_answer")  # blocked in get
            os.kill(os.getpid(), signal.SIGUSR1)
            wait_for(lambda: received, 20, "the handler to run (in the thread blocked in get)")
            setter.set("late", "value")

        threading.Thread(target=signal_then_set, daemon=True).start()
        assert master.get("late") == b"value"
        assert received == [True]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_list_keys_beyond_one_answer_is_an_error_not_a_truncation(master):
    for start in range(0, 65_538, 21_846):
        keys = [f"k{i}" for i in range(start, start + 21_846)]
        master.multi_set(keys, [b""] * len(keys))
    with pytest.raises(DistStoreError, match=r"^list_keys: the store holds 65538 keys, more than "
                                             r"one answer carries \(65535\)$"):
        master.list_keys()


def test_a_master_can_serve_on_a_socket_the_launcher_already_bound():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    store = TCPStore("127.0.0.1", port, 1, True, T30, master_listen_fd=listener.fileno())
    client = TCPStore("127.0.0.1", port, None, False, T30)
    client.set("k", "v")
    assert store.get("k") == b"v" and store.port == port
    store.close()
    listener.close()

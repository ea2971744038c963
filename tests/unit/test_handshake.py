"""The connection handshake (ringtorch/_wire/handshake.py) over socketpairs: what is accepted,
and every way a peer is refused, with the message each side gets."""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import threading
import time

import pytest

from ringtorch._wire.errors import HandshakeError
from ringtorch._wire.framing import recv_exactly
from ringtorch._wire.handshake import (
    HELLO,
    LABEL,
    MAGIC,
    PROTOCOL_VERSION,
    SERVICE_RPC,
    SERVICE_STORE,
    STATUS,
    client_handshake,
    server_handshake,
)

C, S = "the-client", "the-server"


def _handshake(client_secret, server_secret, client_service=SERVICE_STORE,
               server_service=SERVICE_STORE) -> dict[str, object]:
    """Both sides on a socketpair; each side's result or error text."""
    a, b = socket.socketpair()
    out: dict[str, object] = {}

    def serve() -> None:
        try:
            out["server"] = server_handshake(b, server_service, time.monotonic() + 5, C,
                                             b"server info", secret=server_secret,
                                             use_env_secret=False)
        except HandshakeError as exc:
            out["server"] = str(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        out["client"] = client_handshake(a, client_service, time.monotonic() + 5, S,
                                         b"client info", secret=client_secret,
                                         use_env_secret=False)
    except HandshakeError as exc:
        out["client"] = str(exc)
    thread.join()
    a.close()
    b.close()
    return out


def _hello(version: int = PROTOCOL_VERSION, service: int = SERVICE_STORE, flags: int = 0,
           nonce: bytes = b"n" * 32, info: bytes = b"", magic: bytes = MAGIC,
           announced: int | None = None) -> bytes:
    count = len(info) if announced is None else announced
    return HELLO.pack(magic, version, service, flags, nonce, count) + info


def _server_error(raw: bytes, deadline_s: float = 5.0, secret: bytes | None = None) -> str:
    """What server_handshake says about a client that sends ``raw`` and then waits."""
    a, b = socket.socketpair()
    a.sendall(raw)
    try:
        server_handshake(b, SERVICE_STORE, time.monotonic() + deadline_s, C, secret=secret,
                         use_env_secret=False)
    except HandshakeError as exc:
        return str(exc)
    finally:
        a.close()
        b.close()
    raise AssertionError("the server accepted")


def test_no_secret_on_either_side_is_accepted_and_info_goes_both_ways():
    assert _handshake(None, None) == {"client": b"server info", "server": b"client info"}


def test_the_same_secret_on_both_sides_is_accepted():
    assert _handshake(b"s3cret", b"s3cret") == {"client": b"server info",
                                                "server": b"client info"}


def test_different_secrets_are_refused_on_both_sides():
    assert _handshake(b"mine", b"theirs") == {
        "client": f"{S} failed to prove the job secret: RINGTORCH_SECRET differs between this "
                  f"process and the server",
        "server": f"refused {C}: it failed to prove the job secret (wrong RINGTORCH_SECRET)",
    }


def test_a_client_without_the_required_secret_is_refused():
    assert _handshake(None, b"job") == {
        "client": f"{S} requires a job secret and this process has none: set RINGTORCH_SECRET "
                  f"to the job's secret (ringrun sets it for its workers)",
        "server": f"refused {C}: this server requires a job secret and the client has none",
    }


def test_a_client_with_a_secret_refuses_a_server_without_one():
    assert _handshake(b"job", None) == {
        "client": f"{S} has no job secret but this process has one (RINGTORCH_SECRET is set): "
                  f"it cannot prove it belongs to this job, so the connection was refused",
        "server": f"refused {C}: this server has no job secret and the client has one",
    }


def test_a_client_asking_for_another_service_is_refused():
    assert _handshake(None, None, client_service=SERVICE_RPC) == {
        "client": f"{S} is a ringtorch store endpoint, not a rpc endpoint: check the address "
                  f"and port",
        "server": f"refused {C}: this is a ringtorch store endpoint, the client asked for a rpc "
                  f"endpoint",
    }


def test_bytes_that_are_not_ringtorch_are_refused_by_the_magic():
    raw = b"GET / HTTP/1.1\r\nHost: example.org\r\nAccept: */*\r\n\r\n"
    assert _server_error(raw) == (f"{C} does not speak the ringtorch protocol (got b'GET ' "
                                  f"instead of b'RTRC')")


def test_another_protocol_version_is_refused_naming_both():
    assert _server_error(_hello(version=PROTOCOL_VERSION + 1)) == (
        f"{C} speaks ringtorch protocol version {PROTOCOL_VERSION + 1}, this process speaks "
        f"{PROTOCOL_VERSION}: run the same ringtorch version on every node")


def test_a_server_of_another_version_is_refused_by_the_client():
    a, b = socket.socketpair()
    b.sendall(_hello(version=7))
    with pytest.raises(HandshakeError, match=rf"^{S} speaks ringtorch protocol version 7, this "
                                             rf"process speaks {PROTOCOL_VERSION}"):
        client_handshake(a, SERVICE_STORE, time.monotonic() + 5, S, use_env_secret=False)
    a.close()
    b.close()


def test_an_oversized_info_announcement_is_refused_before_allocating():
    assert _server_error(_hello(announced=2**31)) == (
        f"{C} sent 2147483648 bytes of handshake info; at most 4096 allowed")


def test_too_much_info_of_our_own_is_a_value_error():
    a, b = socket.socketpair()
    with pytest.raises(ValueError, match=r"^handshake info is 5000 bytes; at most 4096 allowed$"):
        client_handshake(a, SERVICE_STORE, time.monotonic() + 5, S, b"x" * 5000,
                         use_env_secret=False)
    a.close()
    b.close()


def test_a_silent_client_is_dropped_at_the_deadline():
    started = time.monotonic()
    assert _server_error(b"", deadline_s=0.2) == (
        f"handshake with {C} failed: timed out receiving from {C} (0 of {HELLO.size} bytes "
        f"arrived)")
    assert time.monotonic() - started < 3.0


def test_a_client_that_hangs_up_mid_hello_is_named():
    a, b = socket.socketpair()
    a.sendall(_hello()[:10])
    a.close()
    with pytest.raises(HandshakeError, match=rf"^handshake with {C} failed: connection to {C} "
                                             rf"was closed after 10 of {HELLO.size} expected "
                                             rf"bytes$"):
        server_handshake(b, SERVICE_STORE, time.monotonic() + 5, C, use_env_secret=False)
    b.close()


def _mac(secret: bytes, role: bytes, client_raw: bytes, server_raw: bytes) -> bytes:
    return hmac.new(secret, LABEL + role + client_raw + server_raw, hashlib.sha256).digest()


def _raw_secret_client(sock: socket.socket, hello: bytes, mac_for) -> tuple[int, bytes]:
    """Send hello, read the server's hello and MAC, send mac_for(server_hello), read STATUS."""
    sock.sendall(hello)
    head = bytes(recv_exactly(sock, HELLO.size))
    info = bytes(recv_exactly(sock, HELLO.unpack(head)[5]))
    recv_exactly(sock, 32)
    sock.sendall(mac_for(head + info))
    code, nbytes = STATUS.unpack(recv_exactly(sock, STATUS.size))
    return code, bytes(recv_exactly(sock, nbytes))


def _serve_once(sock: socket.socket, secret: bytes, out: list[str]) -> threading.Thread:
    def serve() -> None:
        try:
            server_handshake(sock, SERVICE_STORE, time.monotonic() + 5, C, secret=secret,
                             use_env_secret=False)
            out.append("accepted")
        except HandshakeError as exc:
            out.append(str(exc))

    thread = threading.Thread(target=serve)
    thread.start()
    return thread


def test_a_forged_client_proof_is_refused_and_told_why():
    a, b = socket.socketpair()
    out: list[str] = []
    thread = _serve_once(b, b"job", out)
    status = _raw_secret_client(a, _hello(flags=1), lambda server_hello: os.urandom(32))
    thread.join()
    assert status == (1, b"wrong job secret")
    assert out == [f"refused {C}: it failed to prove the job secret (wrong RINGTORCH_SECRET)"]


def test_a_replayed_client_proof_is_refused_because_the_server_nonce_changed():
    hello = _hello(flags=1)
    recorded: list[bytes] = []

    def honest(server_hello: bytes) -> bytes:
        recorded.append(_mac(b"job", b"client", hello, server_hello))
        return recorded[-1]

    outcomes: list[str] = []
    for mac_for in (honest, lambda server_hello: recorded[0]):
        a, b = socket.socketpair()
        thread = _serve_once(b, b"job", outcomes)
        _raw_secret_client(a, hello, mac_for)
        thread.join()
    assert outcomes == ["accepted", f"refused {C}: it failed to prove the job secret (wrong "
                                    f"RINGTORCH_SECRET)"]


def _admitting(client_secret, server_secret, admit) -> dict[str, object]:
    """A handshake whose server asks ``admit`` about the client's info."""
    a, b = socket.socketpair()
    out: dict[str, object] = {"asked": []}

    def ask(info: bytes) -> str | None:
        out["asked"].append(info)
        return admit(info)

    def serve() -> None:
        try:
            out["server"] = server_handshake(b, SERVICE_RPC, time.monotonic() + 5, C, b"",
                                             secret=server_secret, use_env_secret=False,
                                             admit=ask)
        except HandshakeError as exc:
            out["server"] = str(exc)

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        out["client"] = client_handshake(a, SERVICE_RPC, time.monotonic() + 5, S, b"rank 1",
                                         secret=client_secret, use_env_secret=False)
    except HandshakeError as exc:
        out["client"] = str(exc)
    thread.join()
    a.close()
    b.close()
    return out


def test_the_server_refuses_an_identity_it_does_not_admit_before_saying_accepted():
    out = _admitting(b"k", b"k", lambda info: f"{info.decode()} is already connected")
    assert out["asked"] == [b"rank 1"]
    assert out["client"] == f"{S} refused the connection: rank 1 is already connected"
    assert out["server"] == f"refused {C}: rank 1 is already connected"


def test_an_admitted_identity_is_accepted():
    out = _admitting(None, None, lambda info: None)
    assert (out["asked"], out["client"], out["server"]) == ([b"rank 1"], b"", b"rank 1")


def test_an_identity_is_not_even_looked_at_before_the_secret_is_proven():
    out = _admitting(b"wrong", b"right", lambda info: None)
    assert out["asked"] == []
    assert out["client"] == (f"{S} failed to prove the job secret: RINGTORCH_SECRET differs "
                             f"between this process and the server")

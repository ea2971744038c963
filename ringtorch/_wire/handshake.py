"""The connection handshake: magic, version, service, then mutual HMAC-SHA256 proof of the
job secret, before any other byte on the connection is interpreted.

Every ringtorch connection (store, collective transport, RPC, launcher rendezvous) starts with
this exchange, written once here. When a job secret is set, both sides prove they know it
without sending it: each side MACs the whole transcript (both hellos, hence both fresh nonces,
the version, the service and each side's info bytes) under its own role label. A replayed or
altered hello fails the MAC; ``hmac.compare_digest`` keeps the comparison constant-time; every
message has a size cap and the whole exchange a deadline of a few seconds.

Messages (little-endian; both hellos have the same layout):

    HELLO   offset  0  4s   magic b"RTRC"
            offset  4  u16  protocol version (PROTOCOL_VERSION)
            offset  6  u8   service (SERVICE_*): what the connection is for
            offset  7  u8   flags: bit 0 set when this side has a job secret
            offset  8  32s  nonce, fresh random bytes
            offset 40  u32  info_nbytes, at most MAX_INFO_NBYTES
            offset 44  ...  info: opaque bytes for the caller (e.g. JSON naming group and rank)
    MAC     32 bytes: HMAC-SHA256(secret, LABEL + role + client_hello + server_hello),
            role b"server" or b"client"; sent only when both sides have a secret
    STATUS  u8 code (0 accepted, 1 refused), u16 reason_nbytes, reason (UTF-8); the server
            may refuse for the identity the client claims in its info (``admit``)

Flow:
    client -> server   HELLO
    server -> client   HELLO, then MAC (if both have secrets)
    client -> server   MAC (if both have secrets)
    server -> client   STATUS
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from ringtorch import _config
from ringtorch._wire import secret_file
from ringtorch._wire.errors import DeadlineExceeded, HandshakeError, PeerClosedError
from ringtorch._wire.framing import recv_exactly, send_all

MAGIC = b"RTRC"
PROTOCOL_VERSION = 1
LABEL = b"ringtorch-handshake-v1|"

SERVICE_STORE = 1
SERVICE_COLLECTIVE = 2
SERVICE_RPC = 3
SERVICE_LAUNCHER = 4
SERVICE_NAMES = {
    SERVICE_STORE: "store",
    SERVICE_COLLECTIVE: "collective transport",
    SERVICE_RPC: "rpc",
    SERVICE_LAUNCHER: "launcher",
}

MAX_INFO_NBYTES = 4096
MAX_REASON_NBYTES = 1024
NONCE_NBYTES = 32
MAC_NBYTES = 32

HELLO = struct.Struct("<4sHBB32sI")
STATUS = struct.Struct("<BH")
_FLAG_HAS_SECRET = 1
_ACCEPTED = 0
_REFUSED = 1


@dataclass(frozen=True)
class Hello:
    """A decoded HELLO message."""

    version: int
    service: int
    has_secret: bool
    nonce: bytes
    info: bytes
    raw: bytes


def job_secret() -> bytes | None:
    """The job secret: RINGTORCH_SECRET, else the per-user secret file (secret_file.py),
    else None (no secret: the file is turned off or could not be created).

    Raises:
        SecretFileError: the secret file exists but other users could read it (or it is not
            this user's, or it is empty).
    """
    text = _config.SECRET.get()
    if text:
        return text.encode()
    path = secret_file.configured_path()
    return secret_file.read_or_create(path) if path else None


def _secret_source(from_file: bool) -> str:
    if from_file:
        return f"from the per-user secret file {secret_file.configured_path()}"
    return "RINGTORCH_SECRET is set"


def _file_hint() -> str:
    """What to do when this process's secret, read from the per-user file, is not the other
    side's."""
    return (f"this process uses the per-user secret file {secret_file.configured_path()} (no "
            f"RINGTORCH_SECRET is set) and the other side holds another secret: copy that file "
            f"to every node of the job (mode 0600), or set RINGTORCH_SECRET to the same value "
            f"on every process")


def handshake_deadline() -> float:
    """An absolute deadline for one handshake, from RINGTORCH_HANDSHAKE_TIMEOUT."""
    return time.monotonic() + _config.HANDSHAKE_TIMEOUT.get()


def _encode_hello(service: int, has_secret: bool, info: bytes) -> bytes:
    if len(info) > MAX_INFO_NBYTES:
        raise ValueError(f"handshake info is {len(info)} bytes; at most {MAX_INFO_NBYTES} allowed")
    flags = _FLAG_HAS_SECRET if has_secret else 0
    head = HELLO.pack(MAGIC, PROTOCOL_VERSION, service, flags, os.urandom(NONCE_NBYTES), len(info))
    return head + info


def _read_hello(sock: socket.socket, deadline: float, peer: str) -> Hello:
    head = bytes(recv_exactly(sock, HELLO.size, deadline, peer))
    magic, version, service, flags, nonce, info_nbytes = HELLO.unpack(head)
    if magic != MAGIC:
        raise HandshakeError(
            f"{peer} does not speak the ringtorch protocol (got {magic!r} instead of {MAGIC!r})"
        )
    if version != PROTOCOL_VERSION:
        raise HandshakeError(
            f"{peer} speaks ringtorch protocol version {version}, this process speaks "
            f"{PROTOCOL_VERSION}: run the same ringtorch version on every node"
        )
    if info_nbytes > MAX_INFO_NBYTES:
        raise HandshakeError(f"{peer} sent {info_nbytes} bytes of handshake info; at most "
                             f"{MAX_INFO_NBYTES} allowed")
    info = bytes(recv_exactly(sock, info_nbytes, deadline, peer))
    return Hello(version, service, bool(flags & _FLAG_HAS_SECRET), nonce, info, head + info)


def _mac(secret: bytes, role: bytes, client_raw: bytes, server_raw: bytes) -> bytes:
    return hmac.new(secret, LABEL + role + client_raw + server_raw, hashlib.sha256).digest()


def _send_status(sock: socket.socket, code: int, reason: str, deadline: float, peer: str) -> None:
    data = reason.encode()[:MAX_REASON_NBYTES]
    send_all(sock, [STATUS.pack(code, len(data)), data], deadline, peer)


def _service_name(service: int) -> str:
    return SERVICE_NAMES.get(service, f"unknown service {service}")


def client_handshake(sock: socket.socket, service: int, deadline: float, peer: str,
                     info: bytes = b"", secret: bytes | None = None,
                     use_env_secret: bool = True) -> bytes:
    """Run the client side of the handshake on a connected socket.

    Args:
        service: SERVICE_* the client expects the server to provide.
        deadline: absolute time.monotonic() by which the handshake must be done.
        peer: how to name the server in errors ("host:port").
        info: bytes the server receives (authenticated when a secret is used).
        secret: the job secret; when None and ``use_env_secret``, RINGTORCH_SECRET is used.

    Returns:
        The server's info bytes.

    Raises:
        HandshakeError: wrong magic/version/service, a secret missing on one side, a wrong
            secret, or the server refused; the message says which and what to do.
    """
    from_file = secret is None and use_env_secret and not _config.SECRET.get()
    if secret is None and use_env_secret:
        secret = job_secret()
    try:
        mine = _encode_hello(service, secret is not None, info)
        send_all(sock, [mine], deadline, peer)
        theirs = _read_hello(sock, deadline, peer)
        if theirs.service != service:
            raise HandshakeError(
                f"{peer} is a ringtorch {_service_name(theirs.service)} endpoint, not a "
                f"{_service_name(service)} endpoint: check the address and port"
            )
        if theirs.has_secret and secret is None:
            raise HandshakeError(
                f"{peer} requires a job secret and this process has none: set RINGTORCH_SECRET "
                f"to the job's secret (ringrun sets it for its workers)"
            )
        if secret is not None and not theirs.has_secret:
            raise HandshakeError(
                f"{peer} has no job secret but this process has one "
                f"({_secret_source(from_file)}): "
                f"it cannot prove it belongs to this job, so the connection was refused"
            )
        if secret is not None:
            server_mac = bytes(recv_exactly(sock, MAC_NBYTES, deadline, peer))
            send_all(sock, [_mac(secret, b"client", mine, theirs.raw)], deadline, peer)
            expected = _mac(secret, b"server", mine, theirs.raw)
            if not hmac.compare_digest(server_mac, expected):
                hint = (_file_hint() if from_file else
                        "RINGTORCH_SECRET differs between this process and the server")
                raise HandshakeError(f"{peer} failed to prove the job secret: {hint}")
        code, reason_nbytes = STATUS.unpack(recv_exactly(sock, STATUS.size, deadline, peer))
        reason = bytes(recv_exactly(sock, min(reason_nbytes, MAX_REASON_NBYTES), deadline, peer))
        if code != _ACCEPTED:
            raise HandshakeError(f"{peer} refused the connection: {reason.decode(errors='replace')}")
        return theirs.info
    except (PeerClosedError, DeadlineExceeded) as exc:
        raise HandshakeError(f"handshake with {peer} failed: {exc}") from exc


def server_handshake(sock: socket.socket, service: int, deadline: float, peer: str,
                     info: bytes = b"", secret: bytes | None = None,
                     use_env_secret: bool = True,
                     admit: Callable[[bytes], str | None] | None = None) -> bytes:
    """Run the server side of the handshake on an accepted socket.

    ``admit(info)``, when given, is asked about the client's info bytes (authenticated when
    there is a secret) before "accepted" is sent: it returns None to accept, or the reason to
    refuse, which is sent to the client. A server that knows whom it expects (the ranks of a
    mesh, the workers of an RPC job) checks the identity claimed here, so that a client it
    would drop is never told it was accepted.

    Returns:
        The client's info bytes, once the client is accepted.

    Raises:
        HandshakeError: the client is refused (the reason was sent to it when the stream
            still allowed it); the caller should log the message and close the socket.
    """
    from_file = secret is None and use_env_secret and not _config.SECRET.get()
    if secret is None and use_env_secret:
        secret = job_secret()
    try:
        theirs = _read_hello(sock, deadline, peer)
        mine = _encode_hello(service, secret is not None, info)
        refusal = None
        if theirs.service != service:
            refusal = (f"this is a ringtorch {_service_name(service)} endpoint, the client asked "
                       f"for a {_service_name(theirs.service)} endpoint")
        elif secret is not None and not theirs.has_secret:
            refusal = "this server requires a job secret and the client has none"
        elif secret is None and theirs.has_secret:
            refusal = "this server has no job secret and the client has one"
        if refusal is not None:
            send_all(sock, [mine], deadline, peer)
            _send_status(sock, _REFUSED, refusal, deadline, peer)
            raise HandshakeError(f"refused {peer}: {refusal}")
        if secret is None:
            send_all(sock, [mine], deadline, peer)
        else:
            send_all(sock, [mine, _mac(secret, b"server", theirs.raw, mine)], deadline, peer)
            client_mac = bytes(recv_exactly(sock, MAC_NBYTES, deadline, peer))
            if not hmac.compare_digest(client_mac, _mac(secret, b"client", theirs.raw, mine)):
                _send_status(sock, _REFUSED, "wrong job secret", deadline, peer)
                hint = _file_hint() if from_file else "wrong RINGTORCH_SECRET"
                raise HandshakeError(f"refused {peer}: it failed to prove the job secret "
                                     f"({hint})")
        refusal = admit(theirs.info) if admit is not None else None
        if refusal is not None:
            _send_status(sock, _REFUSED, refusal, deadline, peer)
            raise HandshakeError(f"refused {peer}: {refusal}")
        _send_status(sock, _ACCEPTED, "", deadline, peer)
        return theirs.info
    except (PeerClosedError, DeadlineExceeded) as exc:
        raise HandshakeError(f"handshake with {peer} failed: {exc}") from exc


__all__ = [
    "MAGIC",
    "PROTOCOL_VERSION",
    "SERVICE_COLLECTIVE",
    "SERVICE_LAUNCHER",
    "SERVICE_RPC",
    "SERVICE_STORE",
    "client_handshake",
    "handshake_deadline",
    "job_secret",
    "server_handshake",
]

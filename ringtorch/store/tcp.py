"""TCPStore: torch's TCP key-value store, a server in the master process and a client in each.

``TCPStore(host_name, port, world_size=None, is_master=False, timeout=timedelta(seconds=300),
wait_for_workers=True, multi_tenant=False)`` has torch's arguments and meaning: the master
process runs the server (``_tcp_server.StoreServer``, in a daemon thread) and is a client of it
too; ``port=0`` picks a free port (read ``.port``); ``wait_for_workers`` makes the master wait
at construction until ``world_size`` clients (itself included) have joined; ``multi_tenant``
shares one server per (host, port) in the process.

One connection per client, behind a lock (one request in flight); each request is one system
call. Blocking operations carry their timeout to the server, which answers STATUS_TIMEOUT at
the deadline; the client waits one grace second longer, so a dead or hung server is reported,
naming host:port. A forked child reconnects on first use, never touching the parent's stream.
A master's server outlives ``close()`` and its process while other processes' clients are
connected, at most RINGTORCH_STORE_LINGER_S (``_tcp_master.linger_at_exit``), so a rank
leaving after its last collective does not pull the store from under a slower one.

Binding (DESIGN.md, Security; ``_tcp_master.py``): a loopback master host name listens there
only; any other binds every interface (without a job secret, with a loud warning).
``master_listen_fd`` hands the master a launcher's already-listening socket.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from datetime import timedelta

from ringtorch import _config
from ringtorch._errors import DistError, DistNetworkError, DistStoreError
from ringtorch._wire.errors import DeadlineExceeded, HandshakeError, PeerClosedError
from ringtorch._wire.handshake import SERVICE_STORE, client_handshake
from ringtorch._wire.sockets import connect_tcp
from ringtorch.store import _protocol as P
from ringtorch.store._table import INTERNAL_PREFIX, display_key
from ringtorch.store._tcp_failures import reconnect_failed, request_failed, still_connecting
from ringtorch.store._tcp_master import (
    Resources,
    StoreAddressInUseError,
    acquire_server,
    hook_exit,
)
from ringtorch.store._tcp_server import StoreServer
from ringtorch.store.base import DEFAULT_TIMEOUT, Store

log = logging.getLogger("ringtorch.store")


@dataclass(frozen=True)
class StoreStatistics:
    """A snapshot of one TCPStore client (trio's ``statistics()``): ``requests_by_op`` maps an
    operation's name ("set", "get", "multi_get", ...) to the requests of it sent."""

    requests_by_op: dict[str, int]

    @property
    def requests(self) -> int:
        """Every request sent, whatever its operation."""
        return sum(self.requests_by_op.values())

JOIN_KEY = INTERNAL_PREFIX + b"joined"
GRACE_S = 1.0
RECONNECT_AFTER_LOSS_S = 1.0  # after a loss, how long to try to connect again (see _reconnect)
_RECV_BUFFER_NBYTES = 64 * 1024
_TIMEVAL = struct.Struct("@ll")
_ONE_KEY_HEAD = struct.Struct(P.REQUEST_HEAD.format + "I")  # the head and the key's length


# ----- fork safety -----------------------------------------------------------------------

_clients: weakref.WeakSet[TCPStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_clients):
        store._forget_connection()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _own_sockets() -> list[socket.socket]:
    """The connected sockets of this process's clients (a master lingers for the others')."""
    return [sock for store in list(_clients)
            if (sock := store._sock) is not None and store._pid == os.getpid()]


class TCPStore(Store):
    """torch's ``TCPStore``; see the module docstring."""

    def __init__(self, host_name: str, port: int, world_size: int | None = None,
                 is_master: bool = False, timeout: timedelta = DEFAULT_TIMEOUT,
                 wait_for_workers: bool = True, multi_tenant: bool = False,
                 master_listen_fd: int | None = None, use_libuv: bool = True) -> None:
        super().__init__(timeout)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must have value from 0 to 65535 but was {port}.")
        if not is_master and port == 0:
            raise ValueError("a TCPStore client needs the server's port; port=0 only makes "
                             "sense with is_master=True")
        self._world_size = world_size if world_size is not None and world_size > 0 else None
        server = None
        connect_host = host_name
        if is_master:
            server = acquire_server(host_name, port, multi_tenant, master_listen_fd)
            hook_exit(_own_sockets)
            port = server.port
            connect_host = "127.0.0.1" if server.host == "0.0.0.0" else server.host
        self._init_client(host_name, port, connect_host, server, multi_tenant)
        try:
            self._connect(time.monotonic() + self._timeout.total_seconds())
            self._request(P.OP_ADD, [JOIN_KEY], 1)
            if is_master and wait_for_workers and self._world_size is not None:
                self._wait_for_workers(self._world_size)
        except BaseException:
            self.close()
            raise
        _clients.add(self)

    @property
    def host(self) -> str:
        """The host name the store was created with."""
        return self._host

    @property
    def port(self) -> int:
        """The server's port (the one picked when created with port=0)."""
        return self._port

    def clone(self) -> TCPStore:
        """A new client connection to the same server (no join, no server of its own)."""
        twin = TCPStore.__new__(TCPStore)
        Store.__init__(twin, self._timeout)
        twin._world_size = self._world_size
        twin._init_client(self._host, self._port, self._connect_host, None, False)
        twin._connect(time.monotonic() + self._timeout.total_seconds())
        _clients.add(twin)
        return twin

    def _init_client(self, host: str, port: int, connect_host: str, server: StoreServer | None,
                     multi_tenant: bool) -> None:
        self._host, self._port, self._connect_host = host, port, connect_host
        self._server, self._multi_tenant = server, multi_tenant
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._pid = os.getpid()
        self._next_id = 0
        self._sent = [0] * (P.MAX_OP + 1)  # requests sent, by op code (statistics())
        self._rcvtimeo = -1.0
        self._lost: str | None = None  # why the last connection broke, until one works again
        self._plain_wait_s = max(self._timeout.total_seconds(), GRACE_S)
        self._buf = bytearray(_RECV_BUFFER_NBYTES)
        self._view = memoryview(self._buf)
        self._max_value = _config.STORE_MAX_VALUE_BYTES.get()
        self._res = Resources(server, host, multi_tenant)
        self._finalizer = weakref.finalize(self, self._res.release)

    def statistics(self) -> StoreStatistics:
        """The requests this client has sent to the server since it was made (a clone counts
        its own), by operation: how many round trips a rendezvous costs a rank."""
        with self._lock:
            sent = list(self._sent)
        return StoreStatistics({P.OP_NAMES[op]: n for op, n in enumerate(sent) if n})

    def set_timeout(self, timeout: timedelta) -> None:
        """See base class."""
        super().set_timeout(timeout)
        self._plain_wait_s = max(self._timeout.total_seconds(), GRACE_S)

    def _describe(self) -> str:
        return f"TCPStore {self._host}:{self._port}"

    def _close(self) -> None:
        with self._lock:
            self._drop_connection()
        self._finalizer()

    # ----- connection -------------------------------------------------------------------

    def _connect(self, deadline: float) -> None:
        """Connect and handshake before ``deadline``; a handshake the server cut short (closed
        or unanswered: a flooded server drops its oldest unauthenticated connections) is tried
        again after a short pause, a wrong secret or a refusal with a reason raised at once."""
        peer, pause = f"{self._host}:{self._port}", 0.01

        def report(waited_s: float, exc: OSError) -> None:
            if self._lost is None:  # a reconnect after a loss tries for 1 s; its error says why
                log.warning(still_connecting(peer, waited_s, exc, self._timeout))
        while True:
            try:
                sock = connect_tcp(self._connect_host, self._port, deadline, report=report)
            except OSError as exc:  # DeadlineExceeded included
                within = f" within {self._timeout}" if isinstance(exc, DeadlineExceeded) else ""
                raise DistNetworkError(f"TCPStore client could not connect to {peer}{within}: "
                                       f"{exc}") from None
            try:
                client_handshake(sock, SERVICE_STORE, min(deadline, time.monotonic() + max(
                    _config.HANDSHAKE_TIMEOUT.get(), 0.1)), peer)
                break
            except HandshakeError as exc:
                sock.close()
                if not isinstance(exc.__cause__, (PeerClosedError, DeadlineExceeded)) or (
                        time.monotonic() + pause >= deadline):
                    raise
            time.sleep(pause)
            pause = min(2 * pause, 0.25)
        sock.settimeout(None)  # blocking: SO_RCVTIMEO bounds each wait, without a poll() per recv
        self._sock = self._res.sock = sock
        self._set_recv_timeout(sock, self._plain_wait_s)

    def _drop_connection(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = self._res.sock = None

    def _forget_connection(self) -> None:
        """In a forked child: leave the parent's socket alone and reconnect when used."""
        self._lock = threading.Lock()
        self._pid = os.getpid()
        # Closing our copy of the descriptor sends nothing: the parent's stream is untouched.
        self._drop_connection()

    def _set_recv_timeout(self, sock: socket.socket, seconds: float) -> None:
        whole = int(seconds)
        value = _TIMEVAL.pack(whole, max(1, int((seconds - whole) * 1e6)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self._rcvtimeo = seconds

    # ----- one request, one answer --------------------------------------------------------

    def _request(self, op: int, fields: list[bytes], arg: int = 0,
                 timeout: timedelta | None = None) -> tuple[int, int, list[bytes]]:
        """Send one request and return the answer's (status, value, fields).

        ``timeout`` is given for blocking ops: the server parks the request that long; we wait
        a grace second more. Other ops must be answered within the store timeout. "No answer"
        ops (set, multi_set, append, queue_push) return (STATUS_OK, 0, []) once sent.
        """
        nbytes = 4 * len(fields) + sum(map(len, fields))
        if nbytes > self._max_value + P.FRAME_SLACK_NBYTES or len(fields) > P.MAX_FIELDS:
            raise ValueError(f"a request of {nbytes} bytes in {len(fields)} fields is over the "
                             f"TCPStore limits ({self._max_value} bytes per value, see "
                             f"RINGTORCH_STORE_MAX_VALUE_BYTES; {P.MAX_FIELDS} keys)")
        if timeout is None:
            tmo_ms, wait_s = 0, self._plain_wait_s
        else:
            seconds = timeout.total_seconds()
            tmo_ms, wait_s = P.timeout_ms(seconds), seconds + GRACE_S
        with self._lock:
            sock = self._sock or self._reconnect()
            self._next_id = rid = (self._next_id + 1) & 0xFFFFFFFF
            self._sent[op] += 1
            head = P.REQUEST_HEAD.pack(nbytes, rid, op, 0, len(fields), tmo_ms, arg)
            try:
                if wait_s != self._rcvtimeo:
                    self._set_recv_timeout(sock, wait_s)
                if nbytes < 65536:
                    sock.sendall(b"".join([head, *P.encode_fields(fields)]))
                else:
                    self._send_large(sock, [head, *P.encode_fields(fields)])
                if op in P.NO_ANSWER_OPS:
                    return P.STATUS_OK, 0, []
                return self._recv_answer(sock, rid)
            except OSError as exc:
                raise self._failed(exc, wait_s) from None

    def _one_key(self, op: int, key: bytes, arg: int = 0,
                 timeout: timedelta | None = None) -> tuple[int, int, list[bytes]]:
        """_request for the common single-key ops (get, add...), with less work per call."""
        if len(key) > P.MAX_KEY_NBYTES:
            self._check_sizes(key)
        if timeout is None:
            tmo_ms, wait_s = 0, self._plain_wait_s
        else:
            seconds = timeout.total_seconds()
            tmo_ms, wait_s = P.timeout_ms(seconds), seconds + GRACE_S
        with self._lock:
            sock = self._sock or self._reconnect()
            self._next_id = rid = (self._next_id + 1) & 0xFFFFFFFF
            self._sent[op] += 1
            try:
                if wait_s != self._rcvtimeo:
                    self._set_recv_timeout(sock, wait_s)
                sock.sendall(_ONE_KEY_HEAD.pack(4 + len(key), rid, op, 0, 1, tmo_ms, arg,
                                                len(key)) + key)
                return self._recv_answer(sock, rid)
            except OSError as exc:
                raise self._failed(exc, wait_s) from None

    def _failed(self, exc: OSError, wait_s: float) -> DistError:
        """The error for a request that broke; the connection is dropped (we reconnect on
        the next request, so no stale answer can be read as a later one's)."""
        self._drop_connection()
        error, lost = request_failed(self._host, self._port, exc, wait_s)
        self._lost = lost or self._lost
        return error

    def _reconnect(self) -> socket.socket:
        """Connect again: within the store timeout the first time (the server may still be
        starting), but within RECONNECT_AFTER_LOSS_S after a connection broke, since a server
        that closed on us and now refuses is gone: every later use then fails in a moment
        instead of retrying for the whole timeout (up to 30 minutes)."""
        if self._lost is None:
            self._connect(time.monotonic() + self._timeout.total_seconds())
        else:
            seconds = min(self._timeout.total_seconds(), RECONNECT_AFTER_LOSS_S)
            try:
                self._connect(time.monotonic() + seconds)
            except (DistNetworkError, HandshakeError):
                raise reconnect_failed(self._host, self._port, self._lost, seconds) from None
            self._lost = None
        assert self._sock is not None
        return self._sock

    def _send_large(self, sock: socket.socket, buffers: list[bytes]) -> None:
        """Send a big request: runs of small buffers joined, big values from their own memory."""
        small: list[bytes] = []
        for buf in buffers:
            if len(buf) < 65536:
                small.append(buf)
                continue
            if small:
                sock.sendall(b"".join(small))
                small = []
            sock.sendall(buf)
        if small:
            sock.sendall(b"".join(small))

    def _recv_answer(self, sock: socket.socket, rid: int) -> tuple[int, int, list[bytes]]:
        buf, view = self._buf, self._view
        head_size = P.RESPONSE_HEAD.size
        got = sock.recv_into(view)
        while got < head_size:
            n = sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionResetError("the server closed the connection")
            got += n
        nbytes, answer_id, status, _, nfields, value = P.RESPONSE_HEAD.unpack_from(buf)
        total = head_size + nbytes
        if answer_id != rid or got > total:
            raise ConnectionResetError(f"protocol error: answer {answer_id} to request {rid}")
        if nbytes == 0 and nfields == 0:
            return status, value, []
        if total > len(buf):
            big = bytearray(nbytes)
            big[:got - head_size] = view[head_size:got]
            self._fill(sock, big, got - head_size)
            fields = P.decode_fields(big, nfields)
        else:
            while got < total:
                n = sock.recv_into(view[got:total])
                if n == 0:
                    raise ConnectionResetError("the server closed the connection")
                got += n
            if nfields == 1 and nbytes == 4 + P.FIELD_LENGTH.unpack_from(buf, head_size)[0]:
                return status, value, [bytes(view[head_size + 4:total])]
            fields = P.decode_fields(view[head_size:total], nfields)
        if fields is None:
            raise ConnectionResetError("protocol error: a malformed answer")
        return status, value, fields

    @staticmethod
    def _fill(sock: socket.socket, big: bytearray, got: int) -> None:
        with memoryview(big) as view:
            while got < len(big):
                n = sock.recv_into(view[got:])
                if n == 0:
                    raise ConnectionResetError("the server closed the connection")
                got += n

    def _call(self, op: int, fields: list[bytes], arg: int = 0,
              timeout: timedelta | None = None) -> tuple[int, int, list[bytes]]:
        """_request, with the server's errors raised as exceptions."""
        status, value, out = self._request(op, fields, arg, timeout)
        if status == P.STATUS_ERROR:
            message = out[0].decode(errors="replace") if out else "unknown error"
            raise (ValueError if value == P.ERROR_VALUE else DistStoreError)(message)
        return status, value, out

    def _check_sizes(self, key: bytes, value: bytes | None = None) -> None:
        if len(key) > P.MAX_KEY_NBYTES:
            raise ValueError(f"key {display_key(key[:40])!r}... is {len(key)} bytes; TCPStore "
                             f"keys are at most {P.MAX_KEY_NBYTES} bytes")
        if value is not None and len(value) > self._max_value:
            raise ValueError(f"value for key {display_key(key)!r} is {len(value)} bytes; "
                             f"TCPStore values are at most {self._max_value} bytes "
                             f"(RINGTORCH_STORE_MAX_VALUE_BYTES)")

    def _wait_for_workers(self, world_size: int) -> None:
        status, count, _ = self._call(P.OP_WAIT_COUNT, [JOIN_KEY], world_size, self._timeout)
        if status == P.STATUS_TIMEOUT:
            seconds = self._timeout.total_seconds()
            shown = int(seconds) if seconds == int(seconds) else seconds
            raise DistStoreError(f"Timed out after {shown} seconds waiting for clients. "
                                 f"{count}/{world_size} clients joined.")

    # ----- the medium -------------------------------------------------------------------

    def _set(self, key: bytes, value: bytes) -> None:
        if len(key) > P.MAX_KEY_NBYTES or len(value) >= 65536 or len(value) > self._max_value:
            self._check_sizes(key, value)
            self._request(P.OP_SET, [key, value])
            return
        # The hot path: one bytes object, one send, no answer to wait for.
        frame = b"".join((_ONE_KEY_HEAD.pack(8 + len(key) + len(value), 0, P.OP_SET, 0, 2, 0, 0,
                                         len(key)), key, P.FIELD_LENGTH.pack(len(value)), value))
        with self._lock:
            sock = self._sock or self._reconnect()
            self._sent[P.OP_SET] += 1
            try:
                sock.sendall(frame)
            except OSError as exc:
                raise self._failed(exc, self._plain_wait_s) from None

    def _get(self, key: bytes, timeout: timedelta) -> bytes | None:
        status, _, out = self._one_key(P.OP_GET, key, 0, timeout)
        return out[0] if status == P.STATUS_OK else None

    def _add(self, key: bytes, amount: int) -> int:
        if not -(2**63) <= amount < 2**63:
            raise ValueError(f"add amount {amount} does not fit in 64 bits")
        status, value, out = self._one_key(P.OP_ADD, key, amount)
        if status == P.STATUS_ERROR:
            raise ValueError(out[0].decode(errors="replace"))
        return value

    def _compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        self._check_sizes(key, desired)
        return self._call(P.OP_COMPARE_SET, [key, expected, desired])[2][0]

    def _wait(self, keys: list[bytes], timeout: timedelta) -> bool:
        if len(keys) == 1:  # the common case, on the single-key path
            return self._one_key(P.OP_WAIT, keys[0], 0, timeout)[0] == P.STATUS_OK
        if keys and max(map(len, keys)) > P.MAX_KEY_NBYTES:
            for key in keys:
                self._check_sizes(key)
        return self._call(P.OP_WAIT, keys, 0, timeout)[0] == P.STATUS_OK

    def _check(self, keys: list[bytes]) -> bool:
        return bool(self._call(P.OP_CHECK, keys)[1])

    def _delete_key(self, key: bytes) -> bool:
        return bool(self._one_key(P.OP_DELETE, key)[1])

    def _num_keys(self) -> int:
        return self._call(P.OP_NUM_KEYS, [])[1]

    def _multi_get(self, keys: list[bytes], timeout: timedelta) -> list[bytes] | None:
        status, _, out = self._call(P.OP_MULTI_GET, keys, 0, timeout)
        return out if status == P.STATUS_OK else None

    def _multi_set(self, keys: list[bytes], values: list[bytes]) -> None:
        fields: list[bytes] = []
        for key, value in zip(keys, values, strict=True):
            self._check_sizes(key, value)
            fields += (key, value)
        self._call(P.OP_MULTI_SET, fields)

    def _append(self, key: bytes, value: bytes) -> None:
        self._check_sizes(key, value)
        self._call(P.OP_APPEND, [key, value])

    def _list_keys(self) -> list[bytes]:
        return self._call(P.OP_LIST_KEYS, [])[2]

    def _queue_push(self, key: bytes, value: bytes) -> None:
        self._check_sizes(key, value)
        self._call(P.OP_QUEUE_PUSH, [key, value])

    def _queue_pop(self, key: bytes, block: bool, timeout: timedelta) -> bytes | None:
        status, _, out = self._call(P.OP_QUEUE_POP, [key], int(block),
                                    timeout if block else None)
        return out[0] if status == P.STATUS_OK else None

    def _queue_len(self, key: bytes) -> int:
        return self._one_key(P.OP_QUEUE_LEN, key)[1]


__all__ = ["StoreAddressInUseError", "StoreStatistics", "TCPStore"]

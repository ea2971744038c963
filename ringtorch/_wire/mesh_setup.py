"""Building a PeerMesh: rendezvous through the store, then one handshaken connection per
channel and peer (see mesh.py for the layout of the mesh and its frames).

Ranks on the same host (same host identity) connect over Unix sockets in the abstract
namespace, others over TCP. The lower rank connects to the higher; every connection starts
with the handshake (handshake.py: magic, version, HMAC on the job secret) whose info is JSON
``{group, rank, kind, token}``; the server checks the group, the rank and its own
per-incarnation token, so a stale or stray client is dropped.

Rendezvous keys (in the group's private store):
    rt_mesh/host/<rank>   host identity of <rank>
    rt_mesh/addr/<rank>   JSON {"tcp": [host, port], "unix": name or null, "token": hex}
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import threading
import time
from datetime import timedelta
from typing import Any

from ringtorch import _config
from ringtorch._errors import DistNetworkError
from ringtorch._wire import handshake
from ringtorch._wire.channel import Channel, TcpChannel, UnixChannel
from ringtorch._wire.errors import DeadlineExceeded, HandshakeError
from ringtorch._wire.mesh import KIND_COLL, KIND_P2P, PeerMesh, host_identity
from ringtorch._wire.sockets import connect_tcp, connect_unix, listen_tcp, listen_unix

log = logging.getLogger(__name__)


def _tcp_address(all_local: bool) -> str:
    if all_local:
        return "127.0.0.1"
    chosen = _config.SOCKET_ADDR.get()
    if not chosen:
        chosen = socket.gethostbyname(socket.gethostname())
        if chosen.startswith("127."):
            raise DistNetworkError(
                f"this host's name resolves to the loopback address {chosen}, which ranks on "
                f"other hosts cannot reach: set RINGTORCH_SOCKET_ADDR to this host's address")
    if handshake.job_secret() is None:
        log.warning("collective transport listening on %s without a job secret: any process "
                    "that can reach this address can connect; set RINGTORCH_SECRET (ringrun "
                    "does) to authenticate every connection", chosen)
    return chosen


def _wait_keys(store: Any, keys: list[str], deadline: float, what: str) -> list[bytes]:
    remaining = max(0.001, deadline - time.monotonic())
    try:
        store.wait(keys, timedelta(seconds=remaining))
    except Exception as exc:  # every store names its timeout error differently
        missing = [k for k in keys if not store.check([k])]
        raise DistNetworkError(
            f"connecting the group failed: {what} {missing} did not appear within "
            f"{remaining:.1f} s ({exc})") from exc
    return [store.get(k) for k in keys]


def _info(group: str, rank: int, kind: str, token: str) -> bytes:
    return json.dumps({"group": group, "rank": rank, "kind": kind, "token": token}).encode()


class _Acceptor:
    """Accepts the connections of the lower ranks, one handshake thread per connection so a
    slow or hostile client cannot stall the others."""

    def __init__(self, listeners: list[socket.socket], group: str, rank: int, token: str,
                 deadline: float) -> None:
        self.expected = {(peer, kind) for peer in range(rank) for kind in (KIND_COLL, KIND_P2P)}
        self.got: dict[tuple[int, str], tuple[socket.socket, bool]] = {}
        self.errors: list[str] = []
        self._lock = threading.Condition()
        self._group, self._rank, self._token, self._deadline = group, rank, token, deadline
        self._listeners = listeners
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name=f"ringtorch-accept-{group}-{rank}")
        if self.expected:
            self._thread.start()

    def _accept_loop(self) -> None:
        while not self._done() and time.monotonic() < self._deadline:
            ready, _, _ = select.select(self._listeners, [], [], 0.2)
            for listener in ready:
                try:
                    sock, _addr = listener.accept()
                except OSError:
                    continue
                unix = listener.family == socket.AF_UNIX
                threading.Thread(target=self._handshake, args=(sock, unix), daemon=True,
                                 name="ringtorch-mesh-handshake").start()

    def _done(self) -> bool:
        with self._lock:
            return self.expected <= self.got.keys()

    def _handshake(self, sock: socket.socket, unix: bool) -> None:
        me = _info(self._group, self._rank, "server", self._token)
        try:
            raw = handshake.server_handshake(sock, handshake.SERVICE_COLLECTIVE,
                                             handshake.handshake_deadline(), "a connecting rank",
                                             info=me)
            info = json.loads(raw)
            key = (int(info["rank"]), str(info["kind"]))
            valid = (info.get("group") == self._group and info.get("token") == self._token
                     and key in self.expected)
        except (HandshakeError, ValueError, KeyError, TypeError) as exc:
            sock.close()
            with self._lock:
                self.errors.append(str(exc))
            return
        with self._lock:
            if not valid or key in self.got:
                sock.close()
                self.errors.append(f"dropped an unexpected connection claiming {info}")
                return
            self.got[key] = (sock, unix)
            self._lock.notify_all()

    def wait(self) -> dict[tuple[int, str], tuple[socket.socket, bool]]:
        with self._lock:
            while not self.expected <= self.got.keys():
                remaining = self._deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted({p for p, _ in self.expected - self.got.keys()})
                    raise DistNetworkError(
                        f"rank {self._rank} of group '{self._group}': ranks {missing} did not "
                        f"connect in time" + (f" (refused: {self.errors})" if self.errors else ""))
                self._lock.wait(min(remaining, 0.2))
            return dict(self.got)


def _connect(addr: dict[str, Any], unix: bool, deadline: float) -> socket.socket:
    if unix and addr.get("unix"):
        try:
            return connect_unix(addr["unix"], min(deadline, time.monotonic() + 2.0))
        except (OSError, DeadlineExceeded):
            pass  # another network namespace: fall back to TCP
    host, port = addr["tcp"]
    return connect_tcp(host, port, deadline)


def connect_mesh(store: Any, rank: int, size: int, group: str, deadline: float,
                 transport: str | None = None) -> PeerMesh:
    """Connect this rank to every other rank of the group; returns when the mesh is complete.

    ``transport`` is "auto" (Unix sockets between ranks of one host, TCP otherwise), "tcp"
    or "unix"; None reads RINGTORCH_TRANSPORT.

    Raises:
        DistNetworkError: a rank did not publish its address or connect before ``deadline``;
            the message names the ranks.
        HandshakeError: a peer failed the handshake (e.g. a different job secret).
    """
    transport = transport or _config.TRANSPORT.get()
    if transport not in ("auto", "tcp", "unix"):
        raise ValueError(f"transport must be 'auto', 'tcp' or 'unix', got {transport!r}")
    me = host_identity()
    store.set(f"rt_mesh/host/{rank}", me)
    hosts = [h.decode() for h in _wait_keys(
        store, [f"rt_mesh/host/{r}" for r in range(size)], deadline, "host records of ranks")]
    same_host = [h == me for h in hosts]
    use_unix = [s and transport != "tcp" for s in same_host]
    token = os.urandom(8).hex()
    listeners = [listen_tcp(_tcp_address(all(same_host)), 0)]
    unix_name = None
    if any(use_unix[:rank]):
        unix_name = f"\0ringtorch-{token}-{os.getpid()}"
        listeners.append(listen_unix(unix_name))
    tcp_host, tcp_port = listeners[0].getsockname()[:2]
    store.set(f"rt_mesh/addr/{rank}",
              json.dumps({"tcp": [tcp_host, tcp_port], "unix": unix_name, "token": token}))
    acceptor = _Acceptor(listeners, group, rank, token, deadline)
    try:
        coll: list[Channel | None] = [None] * size
        p2p: list[Channel | None] = [None] * size
        higher = [f"rt_mesh/addr/{r}" for r in range(rank + 1, size)]
        addrs = [json.loads(a) for a in _wait_keys(store, higher, deadline, "addresses of ranks")]
        for peer, addr in zip(range(rank + 1, size), addrs, strict=True):
            for kind, table in ((KIND_COLL, coll), (KIND_P2P, p2p)):
                sock = _connect(addr, use_unix[peer], deadline)
                handshake.client_handshake(sock, handshake.SERVICE_COLLECTIVE,
                                           handshake.handshake_deadline(), f"rank {peer}",
                                           info=_info(group, rank, kind, addr["token"]))
                table[peer] = _channel(sock, peer)
        for (peer, kind), (sock, _unix) in acceptor.wait().items():
            (coll if kind == KIND_COLL else p2p)[peer] = _channel(sock, peer)
    finally:
        for listener in listeners:
            listener.close()
    return PeerMesh(rank, size, coll, p2p, same_host)


def _channel(sock: socket.socket, peer: int) -> Channel:
    if sock.family == socket.AF_UNIX:
        return UnixChannel(sock, f"rank {peer}")
    return TcpChannel(sock, f"rank {peer}")


__all__ = ["connect_mesh"]

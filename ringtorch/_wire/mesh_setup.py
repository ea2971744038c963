"""Building a PeerMesh: rendezvous through the store, then one handshaken connection per
channel and peer (see mesh.py for the layout of the mesh and its frames).

Ranks on the same host (same host identity) connect over Unix sockets in the abstract
namespace, others over TCP. The lower rank connects to the higher; every connection starts
with the handshake (handshake.py: magic, version, HMAC on the job secret) whose info is JSON
``{group, rank, kind, token}``; the server checks the group, its own per-incarnation token
and that the rank and channel are expected and not yet connected before it answers
"accepted", so a stale or stray client is refused, and a second connection for a rank
already connected is refused loudly (logged, naming the rank and the peer's address).

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
from ringtorch._wire.admission import HandshakePool, tcp_peer
from ringtorch._wire.channel import Channel, TcpChannel, UnixChannel
from ringtorch._wire.errors import DeadlineExceeded
from ringtorch._wire.mesh import KIND_COLL, KIND_P2P, PeerMesh, host_identity
from ringtorch._wire.sockets import connect_tcp, connect_unix, listen_tcp, listen_unix

log = logging.getLogger(__name__)
MAX_HANDSHAKES_IN_FLIGHT = 64


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
    """The values of ``keys`` once all exist: two requests whatever the group's size (a wait,
    then one multi_get), so that the rendezvous costs each rank O(1) round trips."""
    remaining = max(0.001, deadline - time.monotonic())
    try:
        store.wait(keys, timedelta(seconds=remaining))
    except Exception as exc:  # every store names its timeout error differently
        missing = [k for k in keys if not store.check([k])]
        raise DistNetworkError(
            f"connecting the group failed: {what} {missing} did not appear within "
            f"{remaining:.1f} s ({exc})") from exc
    try:
        return list(store.multi_get(keys))
    except NotImplementedError:  # a user's store that only implements get
        return [store.get(k) for k in keys]


def _info(group: str, rank: int, kind: str, token: str) -> bytes:
    return json.dumps({"group": group, "rank": rank, "kind": kind, "token": token}).encode()


class _Acceptor:
    """Accepts the connections of the lower ranks (``_wire/admission.py``: one handshake
    thread per connection, a bounded number at once, so a slow or hostile client cannot stall
    the others). The identity a client claims (group, incarnation token, rank and channel)
    is checked before it is told it was accepted: a rank already connected is refused loudly
    and its first connection kept."""

    def __init__(self, listeners: list[socket.socket], group: str, rank: int, token: str,
                 deadline: float) -> None:
        self.expected = {(peer, kind) for peer in range(rank) for kind in (KIND_COLL, KIND_P2P)}
        self.got: dict[tuple[int, str], tuple[socket.socket, bool]] = {}
        self.errors: list[str] = []
        self._claimed: set[tuple[int, str]] = set()
        self._lock = threading.Condition()
        self._group, self._rank, self._token, self._deadline = group, rank, token, deadline
        self._listeners = listeners
        self._stopped = False
        self._pool = HandshakePool(f"rank {rank} of group '{group}'", MAX_HANDSHAKES_IN_FLIGHT,
                                   self._handshake, self._adopt, log,
                                   refused="refused a connection from")
        for listener in listeners:
            listener.setblocking(False)
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name=f"ringtorch-accept-{group}-{rank}")
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stopped and time.monotonic() < self._deadline:
            try:
                ready, _, _ = select.select(self._listeners, [], [], 0.2)
            except (OSError, ValueError):
                return  # the listeners were closed: the mesh is built
            for listener in ready:
                pause_s = self._pool.accept_ready(listener, tcp_peer)
                if pause_s:
                    time.sleep(pause_s)

    def stop(self) -> None:
        """Stop accepting; shut down the handshakes still in flight (strangers by now)."""
        self._stopped = True
        self._pool.close()

    def _claim(self, raw: bytes, peer: str, claimed: list[tuple[int, str]]) -> str | None:
        """Reserve the rank and channel a client claims (appended to ``claimed``); the reason
        to refuse it, or None."""
        try:
            info = json.loads(raw)
            key = (int(info["rank"]), str(info["kind"]))
        except (ValueError, KeyError, TypeError):
            return "malformed handshake info"
        me = f"rank {self._rank} of group '{self._group}'"
        if info.get("group") != self._group or info.get("token") != self._token:
            return f"this is {me} in another incarnation or group"
        with self._lock:
            if key in self._claimed:
                log.error("%s: refused a second connection claiming to be rank %d (%s channel) "
                          "from %s: rank %d is already connected; its connection is kept", me,
                          key[0], key[1], peer, key[0])
                return f"rank {key[0]} ({key[1]} channel) is already connected to {me}"
            if key not in self.expected:
                return f"{me} expects no connection from rank {key[0]} ({key[1]} channel)"
            self._claimed.add(key)
        claimed.append(key)
        return None

    def _handshake(self, sock: socket.socket, peer: str) -> tuple[tuple[int, str], bool]:
        me = _info(self._group, self._rank, "server", self._token)
        claimed: list[tuple[int, str]] = []
        try:
            handshake.server_handshake(sock, handshake.SERVICE_COLLECTIVE,
                                       handshake.handshake_deadline(), peer, info=me,
                                       admit=lambda raw: self._claim(raw, peer, claimed))
        except Exception as exc:
            with self._lock:
                self._claimed.difference_update(claimed)  # admitted, but it did not hear it
                self.errors.append(str(exc))
            raise
        return claimed[0], sock.family == socket.AF_UNIX

    def _adopt(self, sock: socket.socket, peer: str,
               result: tuple[tuple[int, str], bool]) -> None:
        key, unix = result
        log.debug("rank %d of group '%s': rank %d connected (%s channel) from %s", self._rank,
                  self._group, key[0], key[1], peer)
        with self._lock:
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
        addrs = [json.loads(a) for a in _wait_keys(
            store, higher, deadline, "addresses of ranks")] if higher else []
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
        acceptor.stop()
        for listener in listeners:
            listener.close()
    hosts = ["" if same else _peer_host(ch) for ch, same in zip(coll, same_host, strict=True)]
    return PeerMesh(rank, size, coll, p2p, same_host, hosts)


def _peer_host(ch: Channel | None) -> str:
    sock = getattr(ch, "sock", None)
    if sock is None or sock.family == socket.AF_UNIX:
        return ""
    return str(sock.getpeername()[0])


def _channel(sock: socket.socket, peer: int) -> Channel:
    if sock.family == socket.AF_UNIX:
        return UnixChannel(sock, f"rank {peer}", rank=peer)
    return TcpChannel(sock, f"rank {peer} ({sock.getpeername()[0]})", rank=peer)


__all__ = ["connect_mesh"]

"""How RPC workers find and connect to each other.

At ``init_rpc`` every worker listens on TCP and, for peers on its own host, on an abstract
Unix socket; publishes its name, rank, host identity and addresses in the rendezvous store;
reads everybody else's; and opens one connection to every other worker (Unix socket on the
same host: lower latency and higher throughput than TCP loopback; TCP otherwise). Every
connection starts with the wire handshake (service RPC, HMAC-SHA256 on the job secret when
there is one) before a single byte of it is unpickled; its authenticated ``info`` carries the
worker's name and rank.

A single-host job (the master address is a loopback address) binds TCP to 127.0.0.1 only;
binding a public address without a job secret prints a warning.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import secrets
import selectors
import socket
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from ringtorch import _config
from ringtorch._wire import sockets
from ringtorch._wire.admission import HandshakePool, tcp_peer
from ringtorch._wire.handshake import (
    SERVICE_RPC,
    client_handshake,
    handshake_deadline,
    job_secret,
    server_handshake,
)
from ringtorch._wire.mesh import core_per_rank, host_identity
from ringtorch.distributed.rpc._workerinfo import WorkerInfo, describe
from ringtorch.store import Store

SOCKET_BUFFER_NBYTES = 4 * 1024 * 1024
MAX_HANDSHAKES_IN_FLIGHT = 64
logger = logging.getLogger("ringtorch.distributed.rpc")


def _master_host(init_method: str) -> str | None:
    url = urlparse(init_method)
    if url.scheme == "env":
        return os.environ.get("MASTER_ADDR")
    if url.scheme == "tcp":
        return url.hostname
    return None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def choose_addresses(init_method: str) -> tuple[str, str]:
    """(host to bind, host to advertise) for this worker's TCP listener."""
    master = _master_host(init_method)
    if master and _is_loopback(master):
        return "127.0.0.1", "127.0.0.1"
    advertise = socket.gethostbyname(socket.gethostname())
    if master:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((master, 1))  # no packet is sent: this only picks a route
                advertise = probe.getsockname()[0]
        except OSError:
            pass
    if job_secret() is None:
        warnings.warn("ringtorch RPC is listening on all interfaces without a job secret: "
                      "anyone who can reach this host can run code in this process. Set "
                      "RINGTORCH_SECRET (ringrun sets one for its workers).", stacklevel=3)
    return "0.0.0.0", advertise


def tune(sock: socket.socket) -> None:
    """Blocking mode (deadlines are ours, with poll) and large socket buffers (fewer
    wake-ups for big tensors) on a connected socket."""
    sock.settimeout(None)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_NBYTES)
        except OSError:
            pass


class Listener:
    """The TCP and Unix listening sockets of one worker, and the thread accepting on them.

    Each accepted connection's handshake runs in a thread of its own, at most
    MAX_HANDSHAKES_IN_FLIGHT at once: past that the oldest unauthenticated one is dropped
    (``_wire/admission.py``), so idle strangers cannot multiply threads or lock workers out;
    running out of descriptors pauses accepting (logged) instead of spinning.
    """

    def __init__(self, bind_host: str, advertise_host: str,
                 handshake: Callable[[socket.socket, str], Any],
                 adopt: Callable[[socket.socket, str, Any], None]) -> None:
        self.tcp = sockets.listen_tcp(bind_host, 0)
        self.unix_name = f"\0ringtorch-rpc-{os.getpid()}-{secrets.token_hex(8)}"
        self.unix = sockets.listen_unix(self.unix_name)
        self.address = {"host": advertise_host, "port": self.tcp.getsockname()[1],
                        "unix": self.unix_name[1:], "host_id": host_identity(),
                        "pid": os.getpid()}
        self.pool = HandshakePool("ringtorch RPC", MAX_HANDSHAKES_IN_FLIGHT, handshake, adopt,
                                  logger, refused="refused a connection from")
        self._selector = selectors.DefaultSelector()
        for listener in (self.tcp, self.unix):
            listener.setblocking(False)
            self._selector.register(listener, selectors.EVENT_READ)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rpc-accept")
        self._thread.start()

    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                events = self._selector.select(timeout=0.2)
            except (OSError, ValueError):
                return
            for key, _ in events:
                pause_s = self.pool.accept_ready(key.fileobj, tcp_peer)  # type: ignore[arg-type]
                if pause_s:  # out of descriptors: wait, do not spin
                    self._closed.wait(pause_s)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(1.0)
        self._selector.close()
        self.tcp.close()
        self.unix.close()
        self.pool.close()


def connect(address: dict[str, Any], deadline: float) -> socket.socket:
    """A connected socket to a worker: its Unix socket when it shares our host, else TCP."""
    if address["host_id"] == host_identity():
        try:
            sock = sockets.connect_unix("\0" + address["unix"], min(deadline,
                                                                     time.monotonic() + 5))
            tune(sock)
            return sock
        except OSError:
            pass  # another network namespace: fall back to TCP
    sock = sockets.connect_tcp(address["host"], address["port"], deadline)
    tune(sock)
    return sock


def handshake_info(name: str, rank: int, reads_you: bool = False) -> bytes:
    """What a worker says about itself in the handshake; ``reads_you``: it may read the
    other side's memory (so large tensors may be sent to it by reference, see _cma.py)."""
    return json.dumps({"name": name, "rank": rank, "reads_you": reads_you}).encode()


def parse_info(info: bytes) -> dict[str, Any]:
    """A peer's handshake info, checked.

    Raises:
        ValueError: the info is not what an RPC worker sends.
    """
    data = json.loads(info.decode())
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not isinstance(
            data.get("rank"), int):
        raise ValueError(f"bad RPC handshake info {info[:100]!r}")
    data["reads_you"] = bool(data.get("reads_you", False))
    return data


class Claims:
    """The workers that may still connect to this one: each once, checked in the handshake
    before the connection is accepted; a second connection for a worker is refused loudly and
    the first one kept."""

    def __init__(self, me: WorkerInfo) -> None:
        self._me = describe(me)
        self._my_rank = me.id
        self._cond = threading.Condition()
        self._names: list[str] | None = None  # by rank, once the table of workers is read
        self._taken: set[int] = set()
        self._closed = False

    def expect(self, workers: list[WorkerInfo]) -> None:
        with self._cond:
            self._names = [w.name for w in workers]
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def claim(self, info: dict[str, Any], where: str) -> str | None:
        """Reserve the rank a connecting worker claims; the reason to refuse it, or None."""
        name, rank, me = info["name"], info["rank"], self._me
        with self._cond:
            self._cond.wait_for(lambda: self._names is not None or self._closed,
                                max(0.1, _config.HANDSHAKE_TIMEOUT.get() / 2))
            names = self._names
            if self._closed or names is None:
                return f"{me} is {'shutting down' if self._closed else 'not ready yet'}"
            if not (0 <= rank < len(names) and names[rank] == name) or rank == self._my_rank:
                return f"no worker '{name}' with rank {rank} belongs to this job"
            if rank in self._taken:
                logger.error("ringtorch RPC: refused a second connection claiming to be worker "
                             "'%s' (rank %d) from %s: that worker is already connected to %s; "
                             "its connection is kept", name, rank, where, me)
                return f"worker '{name}' (rank {rank}) is already connected to {me}"
            self._taken.add(rank)
        return None

    def release(self, rank: int) -> None:
        """Free a rank admitted whose client did not hear it was accepted."""
        with self._cond:
            self._taken.discard(rank)


def serve_handshake(sock: socket.socket, where: str, info: bytes,
                    claims: Claims) -> dict[str, Any]:
    """The server side of an incoming connection's handshake: the worker it claims to be is
    checked (``Claims``) before it is told it was accepted; returns its info, or raises to
    refuse it."""
    claimed: dict[str, Any] = {}

    def admit(raw: bytes) -> str | None:
        try:
            theirs = parse_info(raw)
        except ValueError as exc:
            return str(exc)
        refusal = claims.claim(theirs, where)
        if refusal is None:
            claimed.update(theirs)
        return refusal

    try:
        server_handshake(sock, SERVICE_RPC, handshake_deadline(), where, info, admit=admit)
    except BaseException:
        if claimed:
            claims.release(claimed["rank"])
        raise
    return claimed


def client_connect(address: dict[str, Any], info: bytes,
                   deadline: float) -> tuple[socket.socket, dict[str, Any]]:
    """Connect and handshake; return the socket and the server's handshake info."""
    sock = connect(address, deadline)
    where = f"{address['host']}:{address['port']}"
    try:
        theirs = parse_info(client_handshake(
            sock, SERVICE_RPC, min(deadline, time.monotonic() + max(
                1.0, _config.HANDSHAKE_TIMEOUT.get())), where, info))
    except BaseException:
        sock.close()
        raise
    sock.settimeout(None)  # the handshake leaves a timeout: RPC sockets block, we poll
    return sock, theirs


def exchange_addresses(store: Store, rank: int, world_size: int, name: str,
                       address: dict[str, Any]) -> list[dict[str, Any]]:
    """Publish this worker's address; return every worker's, in rank order.

    Raises:
        RuntimeError: two workers use the same name.
    """
    store.set(f"worker/{rank}", json.dumps({"name": name, "rank": rank, **address}))
    # one request for every worker's entry (it waits, as get would, up to the store's
    # timeout): a worker's start-up costs O(1) round trips to the store at any world size
    keys = [f"worker/{r}" for r in range(world_size)]
    try:
        values = store.multi_get(keys)
    except NotImplementedError:  # a user's store (from a custom rendezvous) with get only
        values = [store.get(k) for k in keys]
    table = [json.loads(v) for v in values]
    names: dict[str, int] = {}
    for entry in table:
        if entry["name"] in names:
            raise RuntimeError(f"RPC worker name '{entry['name']}' is used by ranks "
                               f"{names[entry['name']]} and {entry['rank']}: every worker "
                               f"needs a unique name")
        names[entry["name"]] = entry["rank"]
    return table


def default_spin_s(table: list[dict[str, Any]]) -> float:
    """Seconds a reader polls before blocking (``RINGTORCH_RPC_SPIN_US``; -1: auto)."""
    spin_us = _config.RPC_SPIN_US.get()
    if spin_us < 0:  # auto: spin only while every local worker can have a core
        local = sum(1 for entry in table if entry["host_id"] == host_identity())
        spin_us = 50 if core_per_rank(local) else 0
    return spin_us / 1e6

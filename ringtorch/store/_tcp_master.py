"""The master side of TCPStore: where its server listens, and servers shared in-process.

A master whose host name is a loopback address listens on that address only; any other host
name binds every interface, and without a job secret (RINGTORCH_SECRET) that logs a loud
warning. ``multi_tenant`` masters of one (host, port) share one server, counted, closed with
its last user. ``Resources`` is what a TCPStore must release even when it is garbage-collected
without ``close()``. A released server retires (stops listening, serves its connected clients
until they leave, at most RINGTORCH_STORE_LINGER_S); ``linger_at_exit`` makes an exiting process
wait, within the same bound, until the other processes' clients of its servers have left.
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

from ringtorch import _config
from ringtorch._errors import DistNetworkError
from ringtorch._wire.handshake import job_secret
from ringtorch.store import _tcp_server
from ringtorch.store._tcp_server import StoreServer

log = logging.getLogger("ringtorch.store")


class StoreAddressInUseError(DistNetworkError, OSError):
    """The master could not listen: the port is taken. Both a DistNetworkError (torch's type)
    and an OSError (errno EADDRINUSE), so either ``except`` clause catches it."""


# ----- servers shared in-process (multi_tenant) ------------------------------------------

_servers_lock = threading.Lock()
_servers: dict[tuple[str, int], list] = {}  # (host, port) -> [server, users]


def bind_address(host_name: str) -> str:
    """Where a master for ``host_name`` listens: that loopback address, else every interface."""
    try:
        infos = socket.getaddrinfo(host_name, None, type=socket.SOCK_STREAM)
        addrs = [info[4][0] for info in infos]
    except (socket.gaierror, UnicodeError):
        addrs = []
    if addrs and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        return next((a for a in addrs if ":" not in a), addrs[0])
    return "0.0.0.0"


def acquire_server(host_name: str, port: int, multi_tenant: bool,
                    listen_fd: int | None) -> StoreServer:
    with _servers_lock:
        entry = _servers.get((host_name, port)) if multi_tenant and port else None
        if entry is not None and entry[0].owner_pid == os.getpid():
            entry[1] += 1
            return entry[0]
        bind = bind_address(host_name)
        try:
            server = StoreServer(bind, port, listen_fd)
        except OSError as exc:
            error = StoreAddressInUseError(
                f"The server socket has failed to listen on any local network address. "
                f"port: {port}, host: {bind}: {exc.strerror or exc}")
            error.errno = exc.errno
            raise error from None
        if bind == "0.0.0.0" and job_secret() is None:
            log.warning(
                "TCPStore server listens on every interface (0.0.0.0:%d, for host %r) WITHOUT a "
                "job secret: anyone who can reach this port can read and write the store. Set "
                "RINGTORCH_SECRET on every process of the job (ringrun does), or use a loopback "
                "MASTER_ADDR for a single-host job.", server.port, host_name)
        server.start()
        if multi_tenant:
            _servers[(host_name, server.port)] = [server, 1]
        return server


def release_server(server: StoreServer, host_name: str, multi_tenant: bool) -> None:
    with _servers_lock:
        entry = _servers.get((host_name, server.port))
        if multi_tenant and entry is not None and entry[0] is server:
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _servers[(host_name, server.port)]
    server.retire(_config.STORE_LINGER_S.get())


def linger_at_exit(own_peers: set[str]) -> None:
    """At process exit: wait until every client of the servers this process hosts, except this
    process's own (``own_peers``, "host:port" of their sockets), has disconnected, at most
    RINGTORCH_STORE_LINGER_S. A rank that exits right after its last collective must not pull
    the store from under a rank still doing its last round trips."""
    pid = os.getpid()
    servers = [s for s in list(_tcp_server._servers) if s.owner_pid == pid]
    if not servers:
        return
    linger_s = _config.STORE_LINGER_S.get()
    deadline = time.monotonic() + linger_s
    for server in servers:
        left = server.wait_for_clients(own_peers, deadline)
        if left:
            log.warning("TCPStore server on %s: exiting with %d client(s) still connected after "
                        "waiting %.0f s for them (RINGTORCH_STORE_LINGER_S)", server.address,
                        left, linger_s)


class _ExitHook:
    """Which process hooked its exit, and which lingered (each once per process, forks too)."""

    hooked_pid = 0
    lingered_pid = 0


def hook_exit(own_sockets: Callable[[], list[socket.socket]]) -> None:
    """Once per process hosting a server: wait for its clients at exit (``linger_at_exit``),
    at interpreter exit and at a multiprocessing worker's exit (which skips atexit).
    ``own_sockets`` gives this process's own client sockets, which the linger does not wait
    for."""
    if _ExitHook.hooked_pid == os.getpid():
        return
    _ExitHook.hooked_pid = os.getpid()

    def at_exit() -> None:
        # Linger once per process (atexit and multiprocessing's exit hook may both call
        # this), and only when the program ended well: a process leaving through an
        # unhandled exception (``sys.last_value``, set by spawn's wrapper too) must not hide
        # it for the linger's time.
        if _ExitHook.lingered_pid == os.getpid():
            return
        _ExitHook.lingered_pid = os.getpid()
        if getattr(sys, "last_value", None) is not None:
            return
        own: set[str] = set()
        for sock in own_sockets():
            try:
                host, port = sock.getsockname()[:2]
                own.add(f"{host}:{port}")
            except OSError:
                pass
        linger_at_exit(own)

    atexit.register(at_exit)
    mp_util = sys.modules.get("multiprocessing.util")
    if mp_util is not None:
        mp_util.Finalize(None, at_exit, exitpriority=0)


class Resources:
    """What a TCPStore must release even when it is garbage-collected without close()."""

    __slots__ = ("host", "multi_tenant", "server", "sock")

    def __init__(self, server: StoreServer | None, host: str, multi_tenant: bool) -> None:
        self.server = server
        self.host = host
        self.multi_tenant = multi_tenant
        self.sock: socket.socket | None = None

    def release(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        server, self.server = self.server, None
        if server is not None and server.owner_pid == os.getpid():
            release_server(server, self.host, self.multi_tenant)

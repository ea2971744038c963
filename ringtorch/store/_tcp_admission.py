"""Admission of new TCPStore connections: accept, the handshake of each in a thread of its
own (``_wire/admission.py``: a bounded number at once, the oldest dropped to make room), then
the authenticated socket queued for the server loop, which adopts it on its next wake-up.

The rule kept: the server never refuses a newcomer while an unauthenticated connection can be
dropped instead, whether the handshake slots (MAX_HANDSHAKES_IN_FLIGHT) or the connection cap
(RINGTORCH_STORE_MAX_CONNECTIONS) are full; only when every connection is authenticated and the cap reached is
a newcomer refused. A connection is counted at every moment, in its handshake or queued.
"""

from __future__ import annotations

import logging
import queue
import socket
from collections.abc import Callable
from dataclasses import dataclass

from ringtorch import _config
from ringtorch._wire.admission import (
    DROPPED_CONNECTIONS,
    REFUSED_CONNECTIONS,
    HandshakePool,
    tcp_peer,
)
from ringtorch._wire.handshake import SERVICE_STORE, handshake_deadline, server_handshake
from ringtorch._wire.sockets import tune_tcp

log = logging.getLogger("ringtorch.store")

MAX_HANDSHAKES_IN_FLIGHT = 128
DROPPED_SLOWEST = "slowest partial request over the buffer cap"


@dataclass(frozen=True)
class StoreServerStatistics:
    """What a TCPStore server holds now, and what it dropped to stay within its limits."""

    connections: int  # authenticated, served by the loop
    handshakes_in_flight: int
    buffered_bytes: int  # partial request frames, all connections together
    peak_buffered_bytes: int  # the most ``buffered_bytes`` has been
    max_buffered_bytes: int  # the cap (RINGTORCH_STORE_MAX_BUFFERED_BYTES)
    dropped: dict[str, int]  # connections closed to stay within a limit, by reason
    refused_handshakes: int  # failed their handshake (wrong secret, garbage, timeout)
    accept_pauses: int  # accepts paused for want of file descriptors


class StoreAdmission:
    """The connections a TCPStore server has accepted and not yet adopted."""

    def __init__(self, address: str, secret: bytes | None, connections: Callable[[], int],
                 wake: Callable[[], None]) -> None:
        self._secret = secret
        self._connections = connections
        self._wake = wake
        self._pending: queue.SimpleQueue[tuple[socket.socket, str]] = queue.SimpleQueue()
        self.pool = HandshakePool(f"TCPStore server on {address}", MAX_HANDSHAKES_IN_FLIGHT,
                                  self._handshake, self._queue, log, finished=wake,
                                  refused="auth failed from")

    @property
    def waiting(self) -> int:
        """Connections in their handshake or queued for the loop."""
        return self.pool.in_flight + self._pending.qsize()

    def accept(self, listener: socket.socket) -> float:
        """Accept what is waiting on ``listener``; the seconds to stop accepting for (0:
        accept again when it is readable), see ``HandshakePool.accept_ready``."""
        return self.pool.accept_ready(listener, tcp_peer, self._full)

    def _full(self) -> bool:
        return self._connections() + self.waiting >= _config.STORE_MAX_CONNECTIONS.get()

    def _handshake(self, sock: socket.socket, peer: str) -> None:
        sock.setblocking(True)
        tune_tcp(sock)
        server_handshake(sock, SERVICE_STORE, handshake_deadline(), peer, secret=self._secret,
                         use_env_secret=False)
        sock.settimeout(None)
        sock.setblocking(False)

    def _queue(self, sock: socket.socket, peer: str, _result: object) -> None:
        self._pending.put((sock, peer))
        self._wake()

    def take(self) -> list[tuple[socket.socket, str]]:
        """The authenticated connections queued since the last call, for the loop."""
        taken = []
        while not self._pending.empty():
            taken.append(self._pending.get_nowait())
        return taken

    def sockets(self) -> list[socket.socket]:
        """Every socket held here (a forked child closes its copies)."""
        return [*self.pool.sockets(), *(sock for sock, _ in self.take())]

    def statistics(self, connections: int, buffered: int, peak: int, cap: int,
                   dropped_slowest: int) -> StoreServerStatistics:
        """The server's statistics, with what the loop counts given."""
        counts = self.pool.counts()
        dropped = counts.dropped
        if dropped_slowest:
            dropped[DROPPED_SLOWEST] = dropped_slowest
        return StoreServerStatistics(
            connections=connections, handshakes_in_flight=counts.in_flight,
            buffered_bytes=buffered, peak_buffered_bytes=peak, max_buffered_bytes=cap,
            dropped=dropped, refused_handshakes=counts.refused_handshakes,
            accept_pauses=counts.accept_pauses)

    def close(self) -> None:
        """Shut down the handshakes in flight and close the queued connections."""
        self.pool.close()
        for sock, _ in self.take():
            sock.close()


__all__ = [
    "DROPPED_CONNECTIONS",
    "DROPPED_SLOWEST",
    "MAX_HANDSHAKES_IN_FLIGHT",
    "REFUSED_CONNECTIONS",
    "StoreAdmission",
    "StoreServerStatistics",
]

"""Admitting connections on a listening socket before they are authenticated: the handshake
of each one runs in a thread of its own, at most a fixed number at once.

A port that anyone can reach must stay open to the legitimate clients whatever strangers do
to it. The rule kept here: a newcomer is never refused while an unauthenticated connection
can be dropped instead. When every handshake slot is taken (or the owner's connection cap is
reached), the connection that has been in its handshake longest is shut down to make room:
a legitimate handshake takes milliseconds, so the oldest one is the idlest stranger (and a
legitimate client dropped by bad luck retries). Before authentication a connection holds
only what a handshake reads (handshake.py caps every message), and its thread ends as soon
as its socket is shut down, so memory and threads stay bounded by the slot count.

Running out of descriptors (EMFILE, ENFILE) while accepting leaves the listening socket
readable: accepting again at once would spin a core. ``accept_ready`` drops the oldest
unauthenticated connection (freeing a descriptor), logs an error and answers how long the
caller should stop accepting (doubling from 50 ms to 1 s while the shortage lasts).
"""

from __future__ import annotations

import errno
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, NamedTuple

DROPPED_SLOTS = "handshake slots full"
DROPPED_CONNECTIONS = "connection cap reached"
DROPPED_DESCRIPTORS = "out of file descriptors"
REFUSED_CONNECTIONS = "connection cap reached, no unauthenticated connection to drop"
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 1.0
_LOG_EVERY_S = 1.0
_ACCEPT_BATCH = 64


class PoolCounts(NamedTuple):
    """A HandshakePool's counters, read together (see ``HandshakePool.counts``)."""

    in_flight: int
    dropped: dict[str, int]
    refused_handshakes: int
    accept_pauses: int


class HandshakePool:
    """The connections in their handshake on one listening port (see the module docstring).

    ``handshake(sock, peer)`` runs in the connection's thread and returns what the owner
    needs, or raises to refuse (it logs nothing: the pool logs the refusal once).
    ``adopt(sock, peer, result)`` hands an authenticated socket to the owner; it is called
    with the pool's lock held, so that a connection is always counted either here or by the
    owner, never by neither: it must not block. ``finished()``, when given, is called after
    each handshake thread is done with its connection (a retiring owner counts them).
    ``refused`` words the log line of a refusal ("<what>: <refused> <peer>: <why>").
    """

    def __init__(self, what: str, limit: int,
                 handshake: Callable[[socket.socket, str], Any],
                 adopt: Callable[[socket.socket, str, Any], None],
                 log: logging.Logger, finished: Callable[[], None] | None = None,
                 refused: str = "refused the connection from") -> None:
        self.what = what
        self._refused = refused
        self.limit = limit
        self._handshake = handshake
        self._adopt = adopt
        self._finished = finished
        self._log = log
        self._lock = threading.Lock()
        self._shaking: dict[socket.socket, str] = {}  # insertion order: the oldest first
        self.dropped: Counter[str] = Counter()
        self.refused_handshakes = 0  # failed or refused by the handshake itself
        self.accept_pauses = 0  # accepts paused for want of descriptors
        self._backoff_s = 0.0
        self._last_log = 0.0
        self._unlogged = 0

    @property
    def in_flight(self) -> int:
        """Connections in their handshake now."""
        return len(self._shaking)

    def counts(self) -> PoolCounts:
        """The counters as of one moment: dropping the oldest connection to make room and
        taking the newcomer in happen under the pool's lock, so a reader that took them one
        by one could see the drop counted and the newcomer not yet in flight."""
        with self._lock:
            return PoolCounts(len(self._shaking), dict(self.dropped), self.refused_handshakes,
                              self.accept_pauses)

    def sockets(self) -> list[socket.socket]:
        """The sockets in their handshake (a forked child closes its copies; no lock, which
        another thread may have held at the fork: list() of a dict is atomic in CPython)."""
        return list(self._shaking)

    def start(self, sock: socket.socket, peer: str) -> None:
        """Run ``sock``'s handshake in a thread of its own, dropping the oldest connection
        in its handshake first when every slot is taken."""
        with self._lock:
            if len(self._shaking) >= self.limit:
                self._drop_oldest_locked(DROPPED_SLOTS)
            self._shaking[sock] = peer
        try:
            threading.Thread(target=self._run, args=(sock, peer), daemon=True,
                             name=f"ringtorch-handshake-{peer}").start()
        except RuntimeError as exc:  # no thread to be had: this connection waits no longer
            with self._lock:
                self._shaking.pop(sock, None)
                sock.close()
            self._log.warning("%s: closed the connection from %s: %s", self.what, peer, exc)

    def drop_oldest(self, reason: str) -> bool:
        """Shut down the connection longest in its handshake; False when there is none."""
        with self._lock:
            return self._drop_oldest_locked(reason)

    def _drop_oldest_locked(self, reason: str) -> bool:
        if not self._shaking:
            return False
        sock, peer = next(iter(self._shaking.items()))
        del self._shaking[sock]
        self.dropped[reason] += 1  # counted and logged before its client can see it
        self._note_drop(peer, reason)
        try:  # wakes its thread, which then closes it; shut down under the lock, so never
            sock.shutdown(socket.SHUT_RDWR)  # a descriptor the thread closed and reused
        except OSError:
            pass
        return True

    def _note_drop(self, peer: str, reason: str) -> None:
        """Log drops at most once a second (a flood must not flood the log too)."""
        now = time.monotonic()
        self._unlogged += 1
        if now - self._last_log >= _LOG_EVERY_S:
            self._log.warning("%s: dropped %d unauthenticated connection(s) still in their "
                              "handshake to make room for new ones (%s; latest %s; %d dropped "
                              "so far)", self.what, self._unlogged, reason, peer,
                              sum(self.dropped.values()))
            self._last_log = now
            self._unlogged = 0

    def _run(self, sock: socket.socket, peer: str) -> None:
        try:
            self._settle(sock, peer)
        finally:
            if self._finished is not None:
                self._finished()

    def _settle(self, sock: socket.socket, peer: str) -> None:
        try:
            result = self._handshake(sock, peer)
        except Exception as exc:
            with self._lock:
                dropped = self._shaking.pop(sock, None) is None
                sock.close()
            if not dropped:  # logged before it is counted: a reader of the count sees the log
                self._log.warning("%s: %s %s: %s", self.what, self._refused, peer, exc)
                with self._lock:
                    self.refused_handshakes += 1
            return
        with self._lock:
            if self._shaking.pop(sock, None) is None:  # dropped just as it finished
                sock.close()
                return
            self._adopt(sock, peer, result)

    def accept_ready(self, listener: socket.socket, name_peer: Callable[[Any], str],
                     full: Callable[[], bool] | None = None) -> float:
        """Accept every connection waiting on the non-blocking ``listener`` and start its
        handshake. ``full()`` says the owner's connection cap is reached: the oldest
        connection in its handshake is then dropped, or the newcomer refused when there is
        none. At most ``_ACCEPT_BATCH`` at a time, so that a flood cannot starve an owner
        accepting on its event loop. Returns 0, or the seconds to stop accepting for (out of
        descriptors)."""
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                self._backoff_s = 0.0
                return 0.0
            except OSError as exc:
                if listener.fileno() < 0:  # closed by its owner meanwhile
                    return 0.0
                if exc.errno not in _OUT_OF_DESCRIPTORS:
                    self._log.warning("%s: accept failed: %s", self.what, exc)
                    return 0.0
                return self._out_of_descriptors(exc)
            peer = name_peer(addr) if addr else _local_peer(sock)
            if full is not None and full() and not self.drop_oldest(DROPPED_CONNECTIONS):
                self.dropped[REFUSED_CONNECTIONS] += 1
                self._log.warning("%s: refused %s: %s", self.what, peer, REFUSED_CONNECTIONS)
                sock.close()
                continue
            self.start(sock, peer)
        return 0.0

    def _out_of_descriptors(self, exc: OSError) -> float:
        first = self._backoff_s == 0.0
        self.accept_pauses += 1
        self._backoff_s = min(_MAX_BACKOFF_S, 2 * self._backoff_s or _FIRST_BACKOFF_S)
        dropped = self.drop_oldest(DROPPED_DESCRIPTORS)
        if first:
            self._log.error("%s: cannot accept connections: %s; %s, pausing accepts for up "
                            "to %.1f s at a time until descriptors are free again (raise the "
                            "open-files limit, ulimit -n, if this is the job's own load)",
                            self.what, exc, "dropped the oldest unauthenticated connection"
                            if dropped else "no unauthenticated connection to drop",
                            _MAX_BACKOFF_S)
        return self._backoff_s

    def close(self) -> None:
        """Shut down every connection still in its handshake (their threads then end)."""
        with self._lock:
            for sock in self._shaking:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._shaking.clear()


def _local_peer(sock: socket.socket) -> str:
    """How to name a Unix-socket peer: its process id, read from the kernel."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        return f"local process {int.from_bytes(creds[:4], 'little')} (unix socket)"
    except OSError:
        return "a local process (unix socket)"


def tcp_peer(addr: Any) -> str:
    """``host:port`` of a TCP peer address."""
    return f"{addr[0]}:{addr[1]}"


__all__ = ["HandshakePool", "PoolCounts", "tcp_peer"]

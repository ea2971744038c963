"""The TCPStore server: one selectors event loop serving every client of a store.

Each accepted connection first runs the ringtorch handshake in a short thread of its own (a
slow or hostile client never stalls the loop; ``_tcp_admission.py`` bounds them and drops the
oldest unauthenticated one rather than refuse a newcomer), then its socket is handed to the
loop, which reads request frames (``_protocol.py``, split by ``_tcp_parse.py``), applies them to
one KeyValueTable and answers.

Guarantees kept here:
- bytes only: nothing received is unpickled or evaluated; a frame that does not parse (unknown
  op, lengths over the caps, a wrong field count) closes that connection and is logged, and
  every other client is served on as if nothing happened;
- blocking ``get``/``wait``/``multi_get``/``queue_pop`` are parked, never polled: a parked request
  watches one missing key and is re-examined when that key changes; a timer heap answers
  STATUS_TIMEOUT at its deadline and drops it;
- a client silent in the middle of a frame for longer than the handshake timeout is closed
  (slowloris), as is a client that closes mid-frame; partial frames hold at most
  RINGTORCH_STORE_MAX_BUFFERED_BYTES in all: past it the slowest is closed, and logged;
- the loop never raises: an unexpected error closes the connection it came from;
- ``retire`` (a master's store closed) stops listening at once, serves the connected clients
  until they have left (at most RINGTORCH_STORE_LINGER_S), then stops; ``close`` stops at once.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import selectors
import socket
import threading
import time
import weakref

from ringtorch import _config
from ringtorch._wire.handshake import job_secret
from ringtorch._wire.sockets import listen_tcp, tune_tcp
from ringtorch.store import _protocol as P
from ringtorch.store._table import KeyValueTable
from ringtorch.store._tcp_admission import StoreAdmission, StoreServerStatistics
from ringtorch.store._tcp_ops import Conn, Waiter
from ringtorch.store._tcp_parse import HEAD_SIZE, ProtocolError, RequestParser

log = logging.getLogger("ringtorch.store")

RECV_NBYTES = 256 * 1024
OUT_HIGH_WATER_NBYTES = 16 * 1024 * 1024
IDLE_CLIENT_S = 5.0  # a client silent this long, with nothing parked, does not hold a lingering exit

_LISTENER = "listener"
_WAKE = "wake"


_servers: weakref.WeakSet[StoreServer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for server in list(_servers):
        server._abandon_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class StoreServer(RequestParser):
    """A TCPStore server listening on ``host:port`` (``port=0`` picks one; read ``.port``).
    The secret clients must prove is fixed when it is made, whatever the environment does later."""

    def __init__(self, host: str, port: int, listen_fd: int | None = None) -> None:
        self._secret = job_secret()
        if listen_fd is not None:  # a launcher's bound socket: ours is a copy, theirs stays
            self._listener = socket.socket(fileno=os.dup(listen_fd))
            tune_tcp(self._listener)
        else:
            self._listener = listen_tcp(host, port)
        self._listener.setblocking(False)
        self.host = host
        self.port = int(self._listener.getsockname()[1])
        self.address = f"{host}:{self.port}"
        self._pid = os.getpid()
        self._table = KeyValueTable()
        self._waiters: dict[bytes, list[Waiter]] = {}
        self._timers: list[tuple[float, int, object]] = []
        self._live_timers = 0
        self._seq = itertools.count()
        self._conns: set[Conn] = set()
        self._dirty: list[Conn] = []
        self._admission = StoreAdmission(self.address, self._secret, lambda: len(self._conns),
                                         self._wake)
        self._buffered = 0  # bytes of partial request frames, all connections together
        self._peak_buffered = 0
        self._max_buffered = _config.STORE_MAX_BUFFERED_BYTES.get()
        self._dropped_slowest = 0
        self._wake_r, self._wake_w = socket.socketpair()
        for end in (self._wake_r, self._wake_w):
            end.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, _LISTENER)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        self._stopping = False
        self._retire_at: float | None = None  # set by retire(): the monotonic deadline
        self._unlistened = threading.Event()  # the loop closed the listener (retiring)
        self._rbuf = bytearray(RECV_NBYTES)
        self._rview = memoryview(self._rbuf)
        self._max_frame = _config.STORE_MAX_VALUE_BYTES.get() + P.FRAME_SLACK_NBYTES
        self._idle_limit = _config.HANDSHAKE_TIMEOUT.get()
        self._handlers = self._op_handlers()
        self._decoded: dict[bytes, list[bytes]] = {}
        self._thread = threading.Thread(target=self._run, name=f"ringtorch-store-{self.port}",
                                        daemon=True)
        _servers.add(self)

    @property
    def owner_pid(self) -> int:
        """The process whose thread serves (a forked child holds copies of the sockets)."""
        return self._pid

    def start(self) -> StoreServer:
        self._thread.start()
        log.info("TCPStore server listening on %s", self.address)
        return self

    def close(self) -> None:
        """Stop the loop, close every connection and the listening socket."""
        if self._stopping:
            return
        self._stopping = True
        if os.getpid() != self._pid:
            self._abandon_after_fork()
            return
        self._wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(5.0)

    def retire(self, linger_s: float) -> None:
        """Stop listening now, serve the connected clients until they have all left (at most
        ``linger_s`` s), then stop as close() does; returns once the port is free."""
        if self._stopping or os.getpid() != self._pid or not self._thread.is_alive():
            self.close()
            return
        deadline = time.monotonic() + max(linger_s, 0.0)
        self._retire_at = min(self._retire_at or deadline, deadline)
        self._wake()
        if threading.current_thread() is not self._thread:
            self._unlistened.wait(5.0)

    def wait_for_clients(self, ignore: set[str], deadline: float) -> int:
        """Block until every connection but ``ignore``'s (peers as "host:port") has closed or
        gone idle (nothing parked, silent for IDLE_CLIENT_S: a peer training on or stuck does
        not hold the exit, one in its last round trips does), the server has stopped, or
        ``deadline`` (monotonic) has passed; returns how many were still in use."""
        delay = 0.001
        while self._thread.is_alive() and not self._stopping:
            busy_since = time.monotonic() - IDLE_CLIENT_S
            others = sum(1 for conn in list(self._conns) if conn.peer not in ignore and (
                conn.parked or conn.inbuf or conn.last_request > busy_since))
            others += self._admission.waiting
            if not others:
                return 0
            if time.monotonic() >= deadline:
                return others
            time.sleep(delay)
            delay = min(2 * delay, 0.02)
        return 0

    def _abandon_after_fork(self) -> None:
        """In a forked child: close our copies of every socket, so that the parent's death
        still closes its clients' connections (a child holding them would keep them open)."""
        self._stopping = True
        for sock in [self._listener, self._wake_r, self._wake_w,
                     *(c.sock for c in self._conns), *self._admission.sockets()]:
            sock.close()
        self._sel.close()

    def statistics(self) -> StoreServerStatistics:
        """A snapshot of the server's connections and of what they hold (any thread)."""
        return self._admission.statistics(len(self._conns), self._buffered, self._peak_buffered,
                                          self._max_buffered, self._dropped_slowest)

    def serve_forever(self) -> None:
        """Run the loop in the calling thread until close() (the standalone server)."""
        self._run()

    # ----- loop -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                events = self._sel.select(self._next_timeout())
                for key, mask in events:
                    self._on_event(key.data, mask)
                self._fire_timers()
                self._flush_dirty()
                if self._retire_at is not None and self._retired():
                    break
        except Exception:  # a bug: keep it loud, but never leave clients hanging
            log.exception("TCPStore server on %s stopped on an unexpected error", self.address)
        finally:
            self._shutdown()

    def _on_event(self, data: object, mask: int) -> None:
        if data is _LISTENER:
            self._accept()
        elif data is _WAKE:
            self._adopt_pending()
        else:
            assert isinstance(data, Conn)
            try:
                if mask & selectors.EVENT_READ:
                    self._on_readable(data)
                if mask & selectors.EVENT_WRITE and not data.closed:
                    self._flush(data)
            except ProtocolError as exc:
                self._close_conn(data, f"bad request ({exc})")
            except Exception as exc:
                log.exception("TCPStore server on %s: error serving %s", self.address, data.peer)
                self._close_conn(data, f"server error {exc!r}")

    def _retired(self) -> bool:
        """Retiring: close the listener (once); True when the clients have left or time is up."""
        if not self._unlistened.is_set():
            try:
                self._sel.unregister(self._listener)
            except (KeyError, ValueError):
                pass  # paused (out of descriptors)
            self._listener.close()
            self._unlistened.set()
        left = len(self._conns) + self._admission.waiting
        if not left:
            return True
        if time.monotonic() < self._retire_at:
            return False
        log.warning("TCPStore server on %s: stopping with %d client(s) still connected after "
                    "lingering for them (RINGTORCH_STORE_LINGER_S)", self.address, left)
        return True

    def _shutdown(self) -> None:
        self._unlistened.set()
        for conn in list(self._conns):
            self._close_conn(conn, None)
        self._admission.close()
        self._sel.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is already full (a wake-up is pending) or closed

    # ----- connections ------------------------------------------------------------------

    def _accept(self) -> None:
        pause_s = self._admission.accept(self._listener)
        if pause_s:  # out of descriptors: stop watching the listener for a while (no spin)
            self._sel.unregister(self._listener)
            self._push_timer(time.monotonic() + pause_s, _LISTENER)

    def _adopt_pending(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        for sock, peer in self._admission.take():
            conn = Conn(sock, peer)
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _close_conn(self, conn: Conn, reason: str | None) -> None:
        if conn.closed:
            return
        conn.closed = True
        if reason is not None:
            log.warning("TCPStore server on %s: closed the connection from %s: %s",
                        self.address, conn.peer, reason)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        self._buffered -= len(conn.inbuf)  # before the close a client may see
        conn.inbuf = bytearray()
        conn.sock.close()
        self._conns.discard(conn)
        for waiter in list(conn.parked):
            self._retire(waiter)
        conn.out.clear()

    # ----- reading and parsing ----------------------------------------------------------

    def _on_readable(self, conn: Conn) -> None:
        try:
            n = conn.sock.recv_into(self._rview)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close_conn(conn, f"connection error ({exc})" if conn.inbuf else None)
            return
        if not n:
            self._close_conn(conn, f"closed in the middle of a request ({len(conn.inbuf)} "
                                   f"bytes unparsed)" if conn.inbuf else None)
            return
        conn.last_request = time.monotonic()
        inbuf = conn.inbuf
        was_partial = bool(inbuf)
        if was_partial:
            if not self._room_for(conn, n):
                return
            inbuf += self._rview[:n]
            self._buffered += n
            self._peak_buffered = max(self._peak_buffered, self._buffered)
            # Parsed (as bytes) once a whole request is in: a big value arriving in many reads
            # is copied once, not once per read (a head over the caps is refused at once).
            nbytes = P.REQUEST_HEAD.unpack_from(inbuf)[0] if len(inbuf) >= HEAD_SIZE else -1
            if nbytes >= 0 and (len(inbuf) >= HEAD_SIZE + nbytes or nbytes > self._max_frame):
                consumed = self._parse(conn, bytes(inbuf), len(inbuf))
                del inbuf[:consumed]
                self._buffered -= consumed
        else:
            # One copy of what arrived, as bytes: keys and values are then plain slices of it.
            consumed = self._parse(conn, bytes(self._rview[:n]), n)
            if consumed < n and not conn.closed and self._room_for(conn, n - consumed):
                conn.inbuf = bytearray(self._rview[consumed:n])
                self._buffered += n - consumed
                self._peak_buffered = max(self._peak_buffered, self._buffered)
        if conn.inbuf and not conn.closed:
            conn.last_progress = time.monotonic()
            if not was_partial:
                self._push_timer(conn.last_progress + self._idle_limit, conn)

    def _room_for(self, conn: Conn, nbytes: int) -> bool:
        """Room for ``nbytes`` more of ``conn``'s partial request under the cap, made by closing
        the slowest others (least recent progress); False (``conn`` closed) when none left."""
        cap = self._max_buffered
        while self._buffered + nbytes > cap:
            others = [c for c in self._conns if c.inbuf and c is not conn]
            self._dropped_slowest += 1
            if not others:
                self._close_conn(conn, f"its partial request of {len(conn.inbuf) + nbytes} bytes "
                                       f"is over the cap of {cap} bytes on partial requests "
                                       f"(RINGTORCH_STORE_MAX_BUFFERED_BYTES)")
                return False
            slowest = min(others, key=lambda c: c.last_progress)
            self._close_conn(slowest, (
                f"partial requests hold {self._buffered} bytes, at the cap of {cap} "
                f"(RINGTORCH_STORE_MAX_BUFFERED_BYTES), and its {len(slowest.inbuf)}-byte "
                f"partial request made progress least recently "
                f"({time.monotonic() - slowest.last_progress:.2f} s ago)"))
        return True

    # ----- writing ----------------------------------------------------------------------

    def _reply(self, conn: Conn, rid: int, status: int = P.STATUS_OK, value: int = 0,
               fields: list[bytes] | None = None) -> None:
        if conn.closed:
            return
        if fields:
            parts = P.encode_fields(fields)
            nbytes = sum(map(len, fields)) + 4 * len(fields)
            conn.out.append(P.RESPONSE_HEAD.pack(nbytes, rid, status, 0, len(fields), value))
            conn.out.extend(parts)
        else:
            conn.out.append(P.RESPONSE_HEAD.pack(0, rid, status, 0, 0, value))
        if not conn.dirty:
            conn.dirty = True
            self._dirty.append(conn)

    def _flush_dirty(self) -> None:
        dirty, self._dirty = self._dirty, []
        for conn in dirty:
            conn.dirty = False
            if conn.out and not conn.closed and not conn.writing:
                self._flush(conn)

    def _flush(self, conn: Conn) -> None:
        data = conn.out[0] if len(conn.out) == 1 else b"".join(conn.out)
        try:
            sent = conn.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._close_conn(conn, None if isinstance(exc, ConnectionError) else str(exc))
            return
        rest = data[sent:]
        conn.out = [rest] if rest else []
        writing = bool(rest)
        if writing != conn.writing:
            conn.writing = writing
            # Backpressure: a client that does not read its answers is not read from.
            events = selectors.EVENT_WRITE if len(rest) > OUT_HIGH_WATER_NBYTES else (
                selectors.EVENT_READ | selectors.EVENT_WRITE if writing else selectors.EVENT_READ)
            self._sel.modify(conn.sock, events, conn)

    # ----- timers -----------------------------------------------------------------------

    def _push_timer(self, deadline: float, item: object) -> None:
        heapq.heappush(self._timers, (deadline, next(self._seq), item))

    def _next_timeout(self) -> float | None:
        due = self._timers[0][0] if self._timers else None
        if self._retire_at is not None and (due is None or self._retire_at < due):
            due = self._retire_at
        return None if due is None else max(0.0, due - time.monotonic())

    def _fire_timers(self) -> None:
        timers = self._timers
        if not timers:
            return
        now = time.monotonic()
        while timers and timers[0][0] <= now:
            _, _, item = heapq.heappop(timers)
            if isinstance(item, Waiter):
                if not item.done:
                    self._expire(item)
            elif item is _LISTENER:  # the pause after running out of descriptors is over
                if not self._unlistened.is_set() and not self._stopping:
                    self._sel.register(self._listener, selectors.EVENT_READ, _LISTENER)
            elif isinstance(item, Conn) and item.inbuf and not item.closed:
                idle = now - item.last_progress
                if idle >= self._idle_limit:
                    self._close_conn(item, f"silent for {idle:.1f} s in the middle of a request")
                else:
                    self._push_timer(item.last_progress + self._idle_limit, item)
        if len(timers) > 1024 and len(timers) > 4 * self._live_timers:
            self._timers = [t for t in timers if not (isinstance(t[2], Waiter) and t[2].done)]
            heapq.heapify(self._timers)

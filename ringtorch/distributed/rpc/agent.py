"""The RPC agent of one worker: its connections, its calls, its server, its failures.

One agent per process (recorded in _state.py by api.py). It owns one outgoing connection to
every other worker (its calls and their replies), one incoming connection from every other
worker (their calls, served by ``_server.Server``), and a loopback for calls to itself. Every
message is built here: ``request`` pickles the payload for its destination, stamps the
autograd hook's ids in the header and sends; ``on_reply`` loads a reply and completes its
call. The RRef context, the shutdown agreement and distributed autograd reach the agent only
through ``_interfaces.Agent``; distributed autograd's hook is attached the first time a
message or a caller needs it (extensions.py).

Failures: a connection that breaks (EOF within milliseconds of the peer's death, a reset, a
protocol error) marks its worker dead: every call pending on it fails at once with
``RpcPeerDiedError`` naming the worker and the call, and later calls to it fail immediately.
A housekeeping thread fails calls past their deadline, rescues requests served inline for
too long, and runs the periodic tasks of the RRef context and of distributed autograd.
Diagnostics go to the ``ringtorch.distributed.rpc`` logger.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ringtorch._wire.errors import DeadlineExceeded, PeerClosedError
from ringtorch.distributed.rpc import _cma, _mesh, _serialization, extensions, messages
from ringtorch.distributed.rpc._connection import (
    Loopback,
    OutgoingConnection,
    Pending,
    PendingTable,
)
from ringtorch.distributed.rpc._interfaces import AgentStatistics, AutogradHook
from ringtorch.distributed.rpc._server import (
    IncomingConnection,
    Server,
    remote_error_payload,
    resolve_exception,
    yield_inline_role,
)
from ringtorch.distributed.rpc._state import STATE
from ringtorch.distributed.rpc._stream import Message, build_parts
from ringtorch.distributed.rpc._workerinfo import WorkerInfo, describe
from ringtorch.distributed.rpc.errors import (
    RpcPeerDiedError,
    RpcProtocolError,
    RpcTimeoutError,
    lost_worker_error,
)
from ringtorch.distributed.rpc.options import TensorPipeRpcBackendOptions
from ringtorch.futures import Future
from ringtorch.store import Store

logger = logging.getLogger("ringtorch.distributed.rpc")


class RpcAgent:
    """Connections, calls and serving for one worker (see module docstring)."""

    def __init__(self, name: str, rank: int, world_size: int,
                 options: TensorPipeRpcBackendOptions, store: Store) -> None:
        self.info = WorkerInfo(name, rank)  # read-only, as world_size and rpc_timeout
        self.world_size = world_size
        self.rpc_timeout = options.rpc_timeout
        self._options = options
        self._store = store
        self._workers: list[WorkerInfo] = []
        self._by_name: dict[str, WorkerInfo] = {}
        self._outgoing: dict[int, PendingTable] = {}
        self._incoming: dict[int, IncomingConnection] = {}
        self._dead: dict[int, str] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._counts_lock = threading.Lock()
        self._sent = 0
        self._handled = 0
        self._claims = _mesh.Claims(self.info)
        self._response_holds: dict[tuple[int, int], list[Any]] = {}
        self._pids: dict[int, int] = {}
        self._hosts: dict[int, str] = {}  # each worker's address, "" on this host
        self._can_read: dict[int, bool] = {}  # we may copy tensors out of this peer's memory
        self._reads_me: dict[int, bool] = {}  # this peer may copy tensors out of ours
        self._hook: AutogradHook | None = None
        self._hook_lock = threading.Lock()
        self._peer_death_listeners: list[Callable[[int, BaseException], None]] = []
        self._periodic_tasks: list[Callable[[float], None]] = []
        self._closing = False
        self._closed = False
        self._shutting_down = False  # in the graceful agreement: peers may close any moment
        self._server: Server | None = None
        self._listener: _mesh.Listener | None = None
        self._stop = threading.Event()

    # ---- what collaborators read (_interfaces.Agent) ------------------------------------

    def set_rpc_timeout(self, seconds: float) -> None:
        self.rpc_timeout = float(seconds)

    @property
    def closing(self) -> bool:
        return self._closing

    def worker(self, rank: int) -> WorkerInfo:
        return self._workers[rank]

    def is_dead(self, rank: int) -> bool:
        return rank in self._dead

    def dead_ranks(self) -> list[int]:
        with self._lock:
            return sorted(self._dead)

    def on_peer_death(self, listener: Callable[[int, BaseException], None]) -> None:
        self._peer_death_listeners.append(listener)

    def every_tick(self, task: Callable[[float], None]) -> None:
        self._periodic_tasks.append(task)

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._server is not None, "the agent is not started"
        self._server.pool.submit(fn, *args)

    def context_hook(self) -> AutogradHook:
        """The autograd hook, attached on first use (extensions.py)."""
        hook = self._hook
        if hook is None:
            with self._hook_lock:
                if self._hook is None:
                    self._hook = extensions.attach_context_hook(self)
                hook = self._hook
        return hook

    def statistics(self) -> AgentStatistics:
        """A snapshot of this agent (see ``AgentStatistics``)."""
        with self._lock:
            transports = {rank: conn.sock.family.name if isinstance(conn, OutgoingConnection)
                          else "loopback" for rank, conn in self._outgoing.items()}
            by_reference, dead = dict(self._reads_me), dict(self._dead)
        sent, handled = self.counts()
        address = self._listener.address if self._listener is not None else {}
        pool = self._listener.pool.counts() if self._listener is not None else None
        return AgentStatistics(sent, handled, self.pending_calls(), dead,
                               pool.refused_handshakes if pool else 0, transports, by_reference,
                               dict(address), pool.in_flight if pool else 0,
                               pool.dropped if pool else {}, pool.accept_pauses if pool else 0)

    # ---- start-up ---------------------------------------------------------------------

    def start(self, timeout: float) -> None:
        """Listen, exchange addresses through the store, connect to every worker.

        Raises:
            RuntimeError: duplicate worker names; DeadlineExceeded/HandshakeError: a worker
            could not be reached in ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        bind, advertise = _mesh.choose_addresses(self._options.init_method)
        self._listener = _mesh.Listener(bind, advertise, self._handshake, self._adopt)
        table = _mesh.exchange_addresses(self._store, self.info.id, self.world_size, self.info.name,
                                         {**self._listener.address, "cma": _cma.token()})
        spin_s = _mesh.default_spin_s(table)
        here = _mesh.host_identity()
        with self._lock:
            self._pids = {e["rank"]: e["pid"] for e in table}
            self._hosts = {e["rank"]: "" if e["host_id"] == here else e["host"] for e in table}
            self._can_read = {e["rank"]: e["host_id"] == here and _cma.probe(e["pid"], e["cma"])
                             for e in table}
            self._workers = [WorkerInfo(e["name"], e["rank"]) for e in table]
            self._by_name = {w.name: w for w in self._workers}
            self._claims.expect(self._workers)
            self._server = Server(self, self._options.num_worker_threads, spin_s)
            server = self._server
            self._outgoing[self.info.id] = Loopback(
                self.info, self._timeout_error, server.dispatch_local, self.on_reply)
            self._changed.notify_all()
        for entry in table:
            if entry["rank"] != self.info.id:
                self._connect(entry, deadline, spin_s)
        self._wait_for_incoming(deadline)
        assert self._server is not None
        self._server.start()
        threading.Thread(target=self._housekeep, daemon=True, name="rpc-housekeeping").start()

    def _connect(self, entry: dict[str, Any], deadline: float, spin_s: float) -> None:
        peer = self._workers[entry["rank"]]
        reads = self._can_read[peer.id]
        info = _mesh.handshake_info(self.info.name, self.info.id, reads)
        sock, theirs = _mesh.client_connect(entry, info, deadline)
        if (theirs["name"], theirs["rank"]) != (peer.name, peer.id):
            sock.close()
            raise RuntimeError(f"expected {describe(peer)} at {entry['host']}:{entry['port']} "
                               f"but worker '{theirs['name']}' (rank {theirs['rank']}) answered")
        conn = OutgoingConnection(sock, describe(peer), peer.id, self.on_reply,
                                  self._on_outgoing_broken, self._timeout_error, spin_s,
                                  entry["pid"] if reads else None)
        with self._lock:
            self._outgoing[peer.id] = conn

    def _handshake(self, sock: socket.socket, where: str) -> dict[str, Any]:
        me = _mesh.handshake_info(self.info.name, self.info.id)
        return _mesh.serve_handshake(sock, where, me, self._claims)

    def _adopt(self, sock: socket.socket, where: str, info: dict[str, Any]) -> None:
        """Serve an admitted connection (called with the listener's admission lock held)."""
        rank = info["rank"]
        with self._lock:
            if self._closing:
                sock.close()
                return
            conn = IncomingConnection(sock, self._workers[rank],
                                      self._pids[rank] if self._can_read[rank] else None)
            self._reads_me[rank] = info["reads_you"]
            self._incoming[rank] = conn
            self._changed.notify_all()
        _mesh.tune(sock)
        assert self._server is not None
        self._server.add(conn)

    def _wait_for_incoming(self, deadline: float) -> None:
        with self._lock:
            done = self._changed.wait_for(
                lambda: len(self._incoming) == self.world_size - 1,
                max(0.0, deadline - time.monotonic()))
            missing = [w.name for w in self._workers
                       if w.id != self.info.id and w.id not in self._incoming]
        if not done:
            raise DeadlineExceeded(f"RPC workers {missing} did not connect to "
                                   f"{describe(self.info)} in time")

    # ---- names ------------------------------------------------------------------------

    def get_worker_info(self, to: WorkerInfo | str | int | None = None) -> WorkerInfo:
        """The WorkerInfo of a name, a rank or a WorkerInfo (this worker's for None).

        Raises:
            RuntimeError: no worker has that name or rank; the message lists the names.
        """
        if to is None:
            return self.info
        if isinstance(to, WorkerInfo):
            to = to.name
        if isinstance(to, str) and to in self._by_name:
            return self._by_name[to]
        if isinstance(to, int) and not isinstance(to, bool) and 0 <= to < len(self._workers):
            return self._workers[to]
        raise RuntimeError(f"unknown destination worker {to!r}: the workers of this RPC group "
                           f"are {sorted(self._by_name)}")

    # ---- calls ------------------------------------------------------------------------

    def request(self, dst: WorkerInfo, kind: int, payload: Any, timeout: float, what: object,
                *, sync: bool = False, future: Future[Any] | None = None,
                on_done: Callable[[Any, BaseException | None], None] | None = None,
                one_way: bool = False) -> Any:
        """Send a request to ``dst``.

        ``timeout`` is in seconds, 0 for none. With ``sync`` wait here and return the reply's
        value (or raise its error); otherwise complete ``future`` / call ``on_done(value,
        error)`` when the reply comes. One-way messages get no reply.

        Raises:
            Pickling errors (nothing was sent); with ``sync``, the call's error.
        """
        conn = self._outgoing[dst.id]
        encoded = _serialization.encode(payload, dst.id)
        ids = (-1, -1)
        hook = self._hook
        if hook is not None:
            ids = hook.on_send(dst, encoded.tensors)
        message_id = next(self._ids)
        flags = messages.FLAG_ONE_WAY if one_way else 0
        parts, by_reference = build_parts(kind, flags, message_id, ids, encoded,
                                          not one_way and self._reads_me.get(dst.id, False))
        if STATE.handlers[kind].counted:
            self._count(sent=1)
        if one_way:
            self._send(conn, parts, None)
            return None
        holds = encoded.holds + [encoded.buffers] if by_reference else encoded.holds
        pending = Pending(message_id, what, timeout, holds, future, on_done)
        try:
            conn.register(pending)
        except BaseException as exc:
            pending.finish(None, conn.error if conn.error is not None else exc)
        else:
            try:
                self._send(conn, parts, pending.deadline)
            except DeadlineExceeded:
                conn.expire(pending)
        if not sync:
            if not pending.done:
                conn.wake_background_reader()
            return pending
        if not pending.done:
            yield_inline_role()
            conn.wait(pending)
        if pending.error is not None:
            try:
                raise pending.error
            finally:  # break error -> traceback -> this frame -> pending -> error: collected
                del pending, encoded, parts  # late, that cycle's memoryviews crashed the exit
        return pending.value

    def _send(self, conn: PendingTable, parts: list[Any], deadline: float | None) -> None:
        try:
            conn.send(parts, deadline)
        except DeadlineExceeded:
            raise
        except (PeerClosedError, OSError):
            pass  # the connection is marked broken: the pending call carries the error

    def on_reply(self, conn: PendingTable, message: Message) -> None:
        """Load a reply and complete the call it answers (on whichever thread reads)."""
        header = message.header
        peer = self._workers[conn.rank]
        if header.kind not in (messages.RESPONSE, messages.RESPONSE_ERROR):
            raise RpcProtocolError(f"{describe(peer)} sent a message of kind {header.kind} "
                                   f"on a reply stream")
        pending = conn.pop(header.message_id)
        value: Any = None
        error: BaseException | None = None
        try:
            value = self.load(message, peer)
        except BaseException as exc:
            error = exc
        if header.flags & messages.FLAG_WANTS_RELEASE:
            self.request(peer, messages.RELEASE_HOLD, header.message_id, 0, "release",
                         one_way=True)
        if pending is None:
            return
        if error is None and header.kind == messages.RESPONSE_ERROR:
            value, error = None, resolve_exception(*value)
        future = pending.future
        if future is not None and getattr(future, "_has_callbacks", False):
            # user callbacks may block: never run them on the thread reading replies
            assert self._server is not None
            self._server.pool.submit(pending.finish, value, error)
        else:
            pending.finish(value, error)

    def load(self, message: Message, peer: WorkerInfo) -> Any:
        """Unpickle a message from ``peer`` (tensors pass through the autograd hook)."""
        on_tensor = None
        header = message.header
        if header.context_id >= 0:
            on_tensor = self.context_hook().on_recv(peer, header.context_id,
                                                    header.context_message_id)
        return _serialization.decode(message.data, message.buffers, peer.id, on_tensor)

    def encode_reply(self, peer: WorkerInfo, header: messages.Header, value: Any,
                     error: BaseException | None) -> list[Any]:
        """The parts of the reply to ``header``'s request (the error if there is one)."""
        kind = messages.RESPONSE
        if error is None:
            try:
                encoded = _serialization.encode(value, peer.id)
            except BaseException as exc:
                error = exc
        if error is not None:
            kind = messages.RESPONSE_ERROR
            exc_type, text = remote_error_payload(self.info, error)
            encoded = _serialization.encode(
                (exc_type.__module__, exc_type.__qualname__, text), peer.id)
        ids = (-1, -1)
        if header.context_id >= 0 and error is None:
            ids = self.context_hook().on_reply(peer, header.context_id, encoded.tensors)
        parts, by_reference = build_parts(kind, 0, header.message_id, ids, encoded,
                                          self._reads_me.get(peer.id, False))
        holds = encoded.holds + [encoded.buffers] if by_reference else encoded.holds
        if holds:
            with self._lock:
                self._response_holds[(peer.id, header.message_id)] = holds
            head = bytearray(parts[0])
            head[3] |= messages.FLAG_WANTS_RELEASE  # the flags byte of the header
            parts[0] = bytes(head)
        return parts

    def release_hold(self, peer: WorkerInfo, message_id: int) -> None:
        with self._lock:
            self._response_holds.pop((peer.id, message_id), None)

    def _timeout_error(self, pending: Pending) -> BaseException:
        return RpcTimeoutError(f"RPC ran for more than set timeout ({pending.timeout:g} s) and "
                               f"will now be marked with an error: {pending.what}")

    def _count(self, sent: int = 0, handled: int = 0) -> None:
        with self._counts_lock:
            self._sent += sent
            self._handled += handled

    def note_handled(self) -> None:
        self._count(handled=1)

    def counts(self) -> tuple[int, int]:
        with self._counts_lock:
            return self._sent, self._handled

    def log_one_way_error(self, peer: WorkerInfo, header: messages.Header,
                          error: BaseException) -> None:
        kind = messages.KIND_NAMES.get(header.kind, header.kind)
        logger.warning("ringtorch RPC on %s: one-way message %s from %s failed: %r",
                       describe(self.info), kind, describe(peer), error)

    # ---- failures ---------------------------------------------------------------------

    def _on_outgoing_broken(self, conn: PendingTable, exc: BaseException) -> None:
        self.peer_failed(conn.rank, exc)

    def on_incoming_broken(self, conn: IncomingConnection, exc: BaseException) -> None:
        self.peer_failed(conn.peer.id, exc)

    def peer_failed(self, rank: int, reason: BaseException) -> None:
        """Mark a worker dead: fail its pending and later calls, drop its references."""
        with self._lock:
            if rank in self._dead:
                return
            self._dead[rank] = str(reason)
            for key in [k for k in self._response_holds if k[0] == rank]:
                del self._response_holds[key]
        peer = self._workers[rank]
        what = "closed its connection" if self._closing else "died or closed its connection"

        def make_error(pending: Pending | None) -> BaseException:
            return lost_worker_error(describe(peer), self._hosts.get(rank, ""),
                                     describe(self.info), what, reason,
                                     None if pending is None else pending.what)

        if not (self._closing or self._shutting_down):
            logger.warning("ringtorch RPC on %s: %s; calls to it fail from now on",
                           describe(self.info), make_error(None))

        out = self._outgoing.get(rank)
        if out is not None:
            out.fail(make_error)
        inc = self._incoming.get(rank)
        if inc is not None:
            with inc.lock:
                inc.reader_gen += 1
            inc.close()
        for listener in list(self._peer_death_listeners):
            listener(rank, make_error(None))

    # ---- housekeeping and shutdown ----------------------------------------------------

    def _housekeep(self) -> None:
        tick = 0.1
        while not self._stop.wait(tick):
            now = time.monotonic()
            for conn in list(self._outgoing.values()):
                conn.expire_due(now)
            assert self._server is not None
            self._server.rescue_stalled(now)
            for task in list(self._periodic_tasks):
                try:
                    task(now)
                except Exception:
                    logger.exception("ringtorch RPC housekeeping task failed on %s",
                                     describe(self.info))
            tick = 0.005 if now - self._server.last_inline < 1.0 else 0.1

    def begin_shutdown(self) -> None:
        """The graceful agreement has begun: peers may close any moment (not reported)."""
        self._shutting_down = True

    def pending_calls(self) -> int:
        return sum(len(conn.pending) for conn in self._outgoing.values())

    def close(self) -> None:
        """Close every connection and stop every thread of this agent (local, immediate)."""
        with self._lock:
            if self._closed:
                return
            self._closing = True
            self._closed = True
            self._changed.notify_all()
        self._stop.set()
        self._claims.close()
        if self._listener is not None:
            self._listener.close()
        for rank, conn in list(self._outgoing.items()):
            conn.fail(self._shut_down_error(rank))
            if isinstance(conn, OutgoingConnection):
                conn.close()
        if self._server is not None:
            self._server.stop()

    def _shut_down_error(self, rank: int) -> Callable[[Pending | None], BaseException]:
        peer = self._workers[rank]

        def make(pending: Pending | None) -> BaseException:
            call = f": {pending.what}" if pending is not None else ""
            return RpcPeerDiedError(f"RPC was shut down on {describe(self.info)} while "
                                    f"calling {describe(peer)}{call}")
        return make

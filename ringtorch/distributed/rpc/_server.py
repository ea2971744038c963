"""The callee's side of RPC: read requests, run them, send the replies.

Each incoming connection has one reader at a time. The reader loads every request in
arrival order (so the RRef protocol sees messages in the order they were sent), then:

* protocol messages (``Handler.inline``) run right there: they never block;
* a user call runs right there too, on the reader's own thread, when one of the
  ``num_worker_threads`` execution slots is free: a small call is answered with no thread
  hand-off at all. If the call blocks in ringtorch (``rpc_sync``, ``Future.wait``,
  ``to_here``) or is still running after ``RESCUE_AFTER_S``, the reader role passes to a fresh
  thread, so later requests on the connection never wait behind a slow or blocked one;
* otherwise (all slots busy) the call is queued for the worker pool.

At most ``num_worker_threads`` calls execute at once, inline ones included.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import torch

import ringtorch.futures
from ringtorch.distributed.rpc import extensions, messages
from ringtorch.distributed.rpc._interfaces import Agent, AutogradHook, Handler
from ringtorch.distributed.rpc._state import STATE
from ringtorch.distributed.rpc._stream import Message, MessageReader, send_message
from ringtorch.distributed.rpc._threads import ThreadCache, WorkerPool
from ringtorch.distributed.rpc._workerinfo import WorkerInfo
from ringtorch.distributed.rpc.errors import RpcError

RESCUE_AFTER_S = 0.01
# An exception raised by a remote() creation carries the text of its reply (with the owner's
# traceback) under this attribute, so that every later fetch raises the same text.
REMOTE_MESSAGE_ATTR = "_rpc_remote_message"


class ServedAgent(Agent, Protocol):
    """What the server calls on the agent it serves for, besides ``Agent``."""

    def load(self, message: Message, peer: WorkerInfo) -> Any:
        """Unpickle a message from ``peer``."""

    def encode_reply(self, peer: WorkerInfo, header: messages.Header, value: Any,
                     error: BaseException | None) -> list[Any]:
        """The parts of the reply to ``header``'s request."""

    def context_hook(self) -> AutogradHook:
        """The autograd hook (attached on first use)."""

    def on_incoming_broken(self, conn: IncomingConnection, exc: BaseException) -> None:
        """A connection we serve broke: its worker is gone."""

    def log_one_way_error(self, peer: WorkerInfo, header: messages.Header,
                          error: BaseException) -> None:
        """Report the failure of a request that gets no reply."""

    def note_handled(self) -> None:
        """Count one handled message (graceful shutdown's agreement)."""


class _Loopback(Protocol):
    """The loopback connection, as the server serves it (_connection.Loopback)."""

    peer: WorkerInfo

    def send_reply(self, parts: list[Any]) -> None:
        """Deliver a reply to this worker's own call."""


class Deferred:
    """What a handler returns to reply later: when ``future`` completes, with its value."""

    __slots__ = ("future",)

    def __init__(self, future: torch.futures.Future[Any]) -> None:
        self.future = future


class _Slots:
    """How many more calls may execute now (a semaphore, cheaper when nobody waits)."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._waiting = 0
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)

    def try_take(self) -> bool:
        with self._lock:
            if self._free > 0:
                self._free -= 1
                return True
            return False

    def take(self) -> None:
        with self._lock:
            self._waiting += 1
            while self._free <= 0:
                self._freed.wait()
            self._waiting -= 1
            self._free -= 1

    def give(self) -> None:
        with self._lock:
            self._free += 1
            if self._waiting:
                self._freed.notify()


class _Inline:
    """Marks one request running on its connection's reader thread."""

    __slots__ = ("started",)

    def __init__(self) -> None:
        self.started = time.monotonic()


class IncomingConnection:
    """The serving side of one socket."""

    def __init__(self, sock: socket.socket, peer: WorkerInfo, cma_pid: int | None) -> None:
        self.sock = sock
        self.peer = peer
        self.reader = MessageReader(sock, f"worker '{peer.name}' (rank {peer.id})", cma_pid)
        self.send_lock = threading.Lock()
        self.lock = threading.Lock()
        self.reader_gen = 0
        self.inline: _Inline | None = None
        self.closed = False

    def send_reply(self, parts: list[Any]) -> None:
        with self.send_lock:
            send_message(self.sock, parts, None, self.reader.peer)

    def close(self) -> None:
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_frames(tb: Any) -> Any:
    """Skip the RPC framework's own frames at the top of a traceback (if any remain)."""
    first = tb
    while tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == _PACKAGE_DIR:
        tb = tb.tb_next
    return tb if tb is not None else first


def remote_error_payload(worker: WorkerInfo, exc: BaseException) -> tuple[type, str]:
    """(type, message) of an exception raised while serving, the remote traceback included."""
    message = getattr(exc, REMOTE_MESSAGE_ATTR, None)
    if message is None and isinstance(exc, RpcError):
        message = str(exc)  # the framework's own errors say all there is to say
    if message is None:
        tb = "".join(traceback.format_exception(type(exc), exc, _user_frames(exc.__traceback__)))
        message = f"On {worker}:\n{exc!r}\n{tb}"
    return type(exc), message


def resolve_exception(module: str, qualname: str, message: str) -> BaseException:
    """Rebuild a remote exception: its own type when this process has it, with the remote
    message (which includes the remote traceback)."""
    exc_type: Any = sys.modules.get(module)
    for part in qualname.split("."):
        exc_type = getattr(exc_type, part, None)
    if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
        return RuntimeError(f"{module}.{qualname}: {message}")
    try:
        return exc_type(message)
    except BaseException as exc:
        return RuntimeError(f"Failed to create original exception type. Error msg was {exc} "
                            f"Original exception on remote side was {message}")


def yield_inline_role() -> None:
    """Called before a blocking wait: if this thread serves a request inline, let another
    thread take over reading its connection."""
    thread = STATE.thread
    state = thread.inline
    if state is not None:
        thread.inline = None
        server, conn, token = state
        server.handoff(conn, token)


ringtorch.futures.register_blocking_wait_hook(yield_inline_role)


class Server:
    """Runs the requests of every incoming connection of one agent."""

    def __init__(self, agent: ServedAgent, num_threads: int, spin_s: float) -> None:
        self.agent = agent
        self.pool = WorkerPool(num_threads, "rpc-worker")
        self.slots = _Slots(num_threads)
        self.readers = ThreadCache("rpc-serve")
        self.connections: list[IncomingConnection] = []
        self.spin_s = spin_s
        self.last_inline = 0.0
        self._serving = False
        self._lock = threading.Lock()

    def dispatch_local(self, conn: _Loopback, message: Message) -> None:
        """Serve a request this worker sent to itself (on the pool, never inline)."""
        self._dispatch(conn, message)

    def add(self, conn: IncomingConnection) -> None:
        """Serve a connection (from ``start()`` on: requests wait in the socket until the
        agent has connected to every worker, since serving one may need any of them)."""
        conn.reader.spin_max_s = conn.reader._spin_s = self.spin_s
        with self._lock:
            self.connections.append(conn)
            serving = self._serving
        if serving:
            self._start_reader(conn)

    def start(self) -> None:
        """Start serving every connection added so far, and later ones at once."""
        with self._lock:
            self._serving = True
            waiting = list(self.connections)
        for conn in waiting:
            self._start_reader(conn)

    def _start_reader(self, conn: IncomingConnection) -> None:
        with conn.lock:
            conn.reader_gen += 1
            gen = conn.reader_gen
        self.readers.spawn(self._serve, conn, gen)

    def handoff(self, conn: IncomingConnection, token: _Inline) -> None:
        """Give ``conn``'s reader role to a new thread while ``token``'s request runs on."""
        with conn.lock:
            if conn.inline is not token or conn.closed:
                return
            conn.inline = None
            conn.reader_gen += 1
            gen = conn.reader_gen
        self.readers.spawn(self._serve, conn, gen)

    def rescue_stalled(self, now: float) -> None:
        """Hand off every connection whose inline request has run for too long."""
        for conn in self.connections:
            token = conn.inline
            if token is not None and now - token.started > RESCUE_AFTER_S:
                self.handoff(conn, token)

    def _serve(self, conn: IncomingConnection, gen: int) -> None:
        while True:
            try:
                conn.reader.spin()
                message = conn.reader.read(None)
            except Exception as exc:
                with conn.lock:
                    mine = conn.reader_gen == gen and not conn.closed
                if mine:
                    self.agent.on_incoming_broken(conn, exc)
                return
            self._dispatch(conn, message)
            with conn.lock:
                if conn.reader_gen != gen or conn.closed:
                    return

    def _dispatch(self, conn: IncomingConnection | _Loopback, message: Message) -> None:
        header = message.header
        handler = STATE.handlers.get(header.kind)
        if handler is None:  # a kind of an extension not loaded yet, or an unknown kind
            handler = extensions.handler(header.kind)
        try:
            if handler is None:
                raise RuntimeError(f"unknown RPC message kind {header.kind} from worker "
                                   f"'{conn.peer.name}': run the same ringtorch version "
                                   f"everywhere")
            payload = self.agent.load(message, conn.peer)
            prepared = payload if handler.prepare is None else handler.prepare(
                self.agent, conn.peer, payload)
        except BaseException as exc:
            self.reply(conn, header, None, exc, counted=handler is None or handler.counted)
            return
        if handler.inline:
            self._execute(conn, header, handler, prepared)
        elif isinstance(conn, IncomingConnection) and self.slots.try_take():
            self._execute_inline(conn, header, handler, prepared)
        else:
            self.pool.submit(self._execute_pooled, conn, header, handler, prepared)

    def _execute_inline(self, conn: IncomingConnection, header: messages.Header,
                        handler: Handler, prepared: Any) -> None:
        token = _Inline()
        self.last_inline = token.started
        with conn.lock:
            conn.inline = token
        thread = STATE.thread
        thread.inline = (self, conn, token)
        try:
            self._execute(conn, header, handler, prepared)
        finally:
            thread.inline = None
            with conn.lock:
                if conn.inline is token:
                    conn.inline = None
            self.slots.give()

    def _execute_pooled(self, conn: IncomingConnection | _Loopback, header: messages.Header,
                        handler: Handler, prepared: Any) -> None:
        self.slots.take()
        try:
            self._execute(conn, header, handler, prepared)
        finally:
            self.slots.give()

    def _execute(self, conn: IncomingConnection | _Loopback, header: messages.Header,
                 handler: Handler, prepared: Any) -> None:
        try:
            if header.context_id >= 0:
                with self.agent.context_hook().running(header.context_id):
                    result = handler.run(self.agent, conn.peer, prepared)
            else:
                result = handler.run(self.agent, conn.peer, prepared)
        except BaseException as exc:
            self.reply(conn, header, None, exc, handler.counted)
            return
        if isinstance(result, Deferred):
            result.future.add_done_callback(self._reply_later(conn, header, handler.counted))
        else:
            self.reply(conn, header, result, None, handler.counted)

    def _reply_later(self, conn: IncomingConnection | _Loopback, header: messages.Header,
                     counted: bool) -> Callable[[Any], None]:
        def done(fut: torch.futures.Future[Any]) -> None:
            try:
                value = fut.value()
            except BaseException as exc:
                self.reply(conn, header, None, exc, counted)
                return
            self.reply(conn, header, value, None, counted)
        return done

    def reply(self, conn: IncomingConnection | _Loopback, header: messages.Header, value: Any,
              error: BaseException | None, counted: bool) -> None:
        """Send the reply of one request (nothing for one-way messages)."""
        try:
            if header.flags & messages.FLAG_ONE_WAY:
                if error is not None:
                    self.agent.log_one_way_error(conn.peer, header, error)
                return
            conn.send_reply(self.agent.encode_reply(conn.peer, header, value, error))
        except Exception:
            pass
        finally:
            if counted:
                self.agent.note_handled()

    def stop(self) -> None:
        """Close every connection and let the worker threads go."""
        for conn in self.connections:
            with conn.lock:
                conn.reader_gen += 1
            conn.close()
        self.pool.stop()


def is_future(obj: Any) -> bool:
    """Whether ``obj`` is a torch (or ringtorch) Future: what async functions return."""
    return isinstance(obj, torch._C.Future)

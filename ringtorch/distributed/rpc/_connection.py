"""The calling side of RPC connections: pending calls, and who reads their replies.

The thread that makes a synchronous call reads its own reply (leader/follower): it sends,
then, if no other thread is reading this socket, it becomes the reader, spins a few
microseconds on a non-blocking ``recv`` and then blocks in ``poll`` until its reply is there,
completing any other replies it meets on the way. No thread hand-off sits between the reply
arriving and the caller running again. A background thread per connection reads only when
replies are awaited and nobody else is reading (asynchronous calls). Calls a worker makes to
itself go through ``Loopback``: the same messages, copied, without a socket.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ringtorch._wire.errors import DeadlineExceeded, PeerClosedError
from ringtorch.distributed.rpc._stream import (
    Message,
    MessageReader,
    message_from_parts,
    send_message,
)
from ringtorch.distributed.rpc._workerinfo import WorkerInfo
from ringtorch.futures import Future


class Pending:
    """A call awaiting its reply: completes a Future, a waiting caller, or a callback."""

    __slots__ = ("deadline", "done", "error", "event", "future", "holds", "message_id",
                 "on_done", "timeout", "value", "what")

    def __init__(self, message_id: int, what: object, timeout: float, holds: list[Any],
                 future: Future[Any] | None = None,
                 on_done: Callable[[Any, BaseException | None], None] | None = None) -> None:
        self.message_id = message_id
        self.what = what
        self.timeout = timeout
        self.deadline = None if timeout <= 0 else time.monotonic() + timeout
        self.holds = holds
        self.future = future
        self.on_done = on_done
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None
        self.event: threading.Event | None = None

    def finish(self, value: Any, error: BaseException | None) -> None:
        """Record the outcome (once; the caller popped this from the pending table)."""
        self.holds = []
        self.value, self.error = value, error
        self.done = True
        if self.on_done is not None:
            self.on_done(value, error)
        if self.future is not None:
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(value)
        event = self.event
        if event is not None:
            event.set()


class PendingTable:
    """Calls awaiting their replies on one connection, failed all at once if it breaks."""

    def __init__(self, peer_desc: str, rank: int,
                 timeout_error: Callable[[Pending], BaseException]) -> None:
        self.peer_desc = peer_desc
        self.rank = rank
        self.lock = threading.Lock()
        self.pending: dict[int, Pending] = {}
        self.error: BaseException | None = None
        self.timeout_error = timeout_error
        # holds of calls that timed out: the peer may still read their message
        self.late_holds: dict[int, list[Any]] = {}

    def register(self, pending: Pending) -> None:
        """Add a call awaiting its reply (before sending it).

        Raises:
            The connection's error, if it is already broken.
        """
        with self.lock:
            if self.error is not None:
                raise self.error
            self.pending[pending.message_id] = pending

    def pop(self, message_id: int) -> Pending | None:
        """Take the call a reply belongs to out of the table (None if it timed out)."""
        with self.lock:
            pending = self.pending.pop(message_id, None)
            if pending is None:
                self.late_holds.pop(message_id, None)
            return pending

    def expire(self, pending: Pending) -> None:
        """Fail ``pending`` with its timeout error if it is still waiting."""
        with self.lock:
            if self.pending.get(pending.message_id) is not pending:
                return
            del self.pending[pending.message_id]
            if pending.holds:
                self.late_holds[pending.message_id] = pending.holds
        pending.finish(None, self.timeout_error(pending))

    def expire_due(self, now: float) -> None:
        """Fail every call whose deadline has passed (the housekeeping thread calls this)."""
        with self.lock:
            due = [p for p in self.pending.values() if p.deadline is not None
                   and p.deadline <= now]
            for p in due:
                del self.pending[p.message_id]
                if p.holds:
                    self.late_holds[p.message_id] = p.holds
        for p in due:
            p.finish(None, self.timeout_error(p))

    def fail(self, make_error: Callable[[Pending | None], BaseException]) -> None:
        """Break the connection: fail every pending call, and every later one, at once."""
        with self.lock:
            if self.error is not None:
                return
            self.error = make_error(None)
            failed = list(self.pending.values())
            self.pending.clear()
            self.late_holds.clear()
            self._on_fail()
        for p in failed:
            p.finish(None, make_error(p))

    def _on_fail(self) -> None:
        """Called with the lock held when the connection breaks."""

    def follow(self, pending: Pending) -> None:
        """Wait (without reading) until ``pending`` is finished or its deadline passes."""
        event = threading.Event()
        pending.event = event
        if pending.done:
            return
        timeout = None if pending.deadline is None else pending.deadline - time.monotonic()
        if not event.wait(timeout) and not pending.done:
            self.expire(pending)

    def wake_background_reader(self) -> None:
        """Make sure someone reads replies: called after registering an asynchronous call."""

    def wait(self, pending: Pending) -> None:
        """Wait for ``pending`` to finish (or time out)."""
        self.follow(pending)

    def send(self, parts: list[Any], deadline: float | None) -> None:
        """Send one message to the peer.

        Raises:
            DeadlineExceeded: not sent by ``deadline``; PeerClosedError/OSError: the
            connection broke (it is marked broken).
        """
        raise NotImplementedError


class OutgoingConnection(PendingTable):
    """The calling side of one socket: pending calls, and who reads the replies."""

    def __init__(self, sock: socket.socket, peer_desc: str, rank: int,
                 on_message: Callable[[OutgoingConnection, Message], None],
                 on_broken: Callable[[OutgoingConnection, BaseException], None],
                 timeout_error: Callable[[Pending], BaseException], spin_s: float,
                 cma_pid: int | None) -> None:
        super().__init__(peer_desc, rank, timeout_error)
        self.sock = sock
        self.reader = MessageReader(sock, peer_desc, cma_pid, spin_s)
        self.send_lock = threading.Lock()
        self._wakeup = threading.Condition(self.lock)
        self._reader_thread: int | None = None
        self._on_message = on_message
        self._on_broken = on_broken
        threading.Thread(target=self._background, daemon=True,
                         name=f"rpc-replies-{rank}").start()

    def send(self, parts: list[Any], deadline: float | None) -> None:
        """Send one message (see ``send_message``); a broken stream breaks the connection."""
        with self.send_lock:
            try:
                send_message(self.sock, parts, deadline, self.peer_desc)
            except DeadlineExceeded:
                raise
            except (PeerClosedError, OSError) as exc:
                self._on_broken(self, exc)
                raise

    def wake_background_reader(self) -> None:
        with self.lock:
            if self._reader_thread is None:
                self._wakeup.notify()

    def wait(self, pending: Pending) -> None:
        """Wait for ``pending`` to finish (or time out), reading replies if nobody else is."""
        me = threading.get_ident()
        while True:
            with self.lock:
                if pending.done:
                    return
                leader = self._reader_thread in (None, me)
                nested = self._reader_thread == me
                if leader:
                    self._reader_thread = me
            if not leader:
                self.follow(pending)
                continue
            try:
                self._lead(pending)
            finally:
                if not nested:
                    with self.lock:
                        self._reader_thread = None
                        if self.pending:
                            self._wakeup.notify()

    def _lead(self, pending: Pending) -> None:
        while not pending.done:
            try:
                self.reader.spin()
                self._on_message(self, self.reader.read(pending.deadline))
            except DeadlineExceeded:
                self.expire(pending)
                return
            except Exception as exc:
                self._on_broken(self, exc)  # the stream is unusable
                return

    def _on_fail(self) -> None:
        self._wakeup.notify_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _background(self) -> None:
        me = threading.get_ident()
        while True:
            with self.lock:
                while self.error is None and (self._reader_thread is not None
                                              or not self.pending):
                    self._wakeup.wait()
                if self.error is not None:
                    return
                self._reader_thread = me
            try:
                while True:
                    message = self.reader.read(None)
                    self._on_message(self, message)
                    with self.lock:
                        if not self.pending:
                            self._reader_thread = None
                            break
            except Exception as exc:
                with self.lock:
                    self._reader_thread = None
                self._on_broken(self, exc)
                return

    def close(self) -> None:
        """Close the socket (the background reader exits)."""
        with self.lock:
            if self.error is None:
                self.error = PeerClosedError(f"connection to {self.peer_desc} was closed")
            self._wakeup.notify_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class Loopback(PendingTable):
    """Calls a worker makes to itself: the same messages, copied, without a socket.

    ``serve(self, message)`` serves a request (the server, on its pool); ``deliver(self,
    message)`` completes a call with its reply (the agent's ``on_reply``).
    """

    def __init__(self, me: WorkerInfo, timeout_error: Callable[[Pending], BaseException],
                 serve: Callable[[Loopback, Message], None],
                 deliver: Callable[[PendingTable, Message], None]) -> None:
        super().__init__(f"worker '{me.name}' (rank {me.id})", me.id, timeout_error)
        self.peer = me
        self._serve = serve
        self._deliver = deliver

    def send(self, parts: list[Any], deadline: float | None) -> None:
        self._serve(self, message_from_parts(parts))

    def send_reply(self, parts: list[Any]) -> None:
        self._deliver(self, message_from_parts(parts))

"""Point-to-point messages between the ranks of a group, matched by (source, tag).

One reader thread per peer reads that peer's p2p channel all the time, so a send never waits
for the receiver to call ``recv`` (torch programs post isend/irecv in any order; both ranks may
receive first) and control frames (abort, goodbye, status queries) arrive whatever the
receiver's caller is doing. A message that finds a posted receive is read straight into the
receiver's buffer; otherwise it is buffered until a receive matches it. Matching keeps the
order of messages from one source with one tag, like MPI and torch.

Reader threads never send and never block on a lock a sender holds, so two ranks exchanging
large messages cannot deadlock each other's readers. They report everything that is not data
through ``on_event(peer, kind, payload)``.

P2P frame (little-endian):
    offset  0  u8   kind: 1 DATA, 2 ABORT (payload: UTF-8 reason), 3 BYE (the peer closes
                    its group), 4 STATUS_REQ, 5 STATUS (payload: UTF-8 JSON), 6 ABORT_LOST
                    (as ABORT, for a cause that is a lost connection: a peer died or is
                    unreachable)
    offset  8  i64  tag (DATA only)
    offset 16  u64  payload bytes that follow
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ringtorch._wire.channel import Channel
from ringtorch._wire.errors import DeadlineExceeded, PeerClosedError, PeerUnreachableError
from ringtorch._wire.framing import BytesLike

P2P_HEADER = struct.Struct("<B7xqQ")
DATA, ABORT, BYE, STATUS_REQ, STATUS, ABORT_LOST = 1, 2, 3, 4, 5, 6
KIND_NAMES = {ABORT: "abort", BYE: "bye", STATUS_REQ: "status_request", STATUS: "status",
              ABORT_LOST: "abort_lost"}
MAX_CONTROL_NBYTES = 64 * 1024

EventHandler = Callable[[int, str, bytes], None]


@dataclass(frozen=True)
class MailboxStatistics:
    """A snapshot of a Mailbox, for tests and diagnostics (trio's ``statistics()``).

    Attributes:
        sent: data messages sent, per peer rank.
        arrived: data messages whose frame this rank's readers began to read, per source.
        delivered: data messages handed to a receive (posted or taken from the buffer), per
            source.
        buffered: messages that arrived before any receive matched them, not yet taken.
        waiting_receives: receives posted and waiting for their message.
        failed: the whole mailbox failed (every receive raises).
        gone_peers: peers whose receives fail (they left or were lost), in rank order.
    """

    sent: tuple[int, ...]
    arrived: tuple[int, ...]
    delivered: tuple[int, ...]
    buffered: int
    waiting_receives: int
    failed: bool
    gone_peers: tuple[int, ...]


class RecvError(Exception):
    """A posted receive failed; ``error`` is what the caller raises."""


class _Posted:
    __slots__ = ("src", "tag", "view", "event", "sender", "error")

    def __init__(self, src: int | None, tag: int, view: memoryview) -> None:
        self.src, self.tag, self.view = src, tag, view
        self.event = threading.Event()
        self.sender = -1
        self.error: BaseException | None = None


class _Arrived:
    __slots__ = ("src", "tag", "data", "complete")

    def __init__(self, src: int, tag: int, nbytes: int) -> None:
        self.src, self.tag = src, tag
        self.data = bytearray(nbytes)
        self.complete = False


def _size_error(src: int, tag: int, nbytes: int, capacity: int) -> RuntimeError:
    return RuntimeError(f"rank {src} sent {nbytes} bytes with tag {tag}, but the matching "
                        f"receive buffer holds {capacity} bytes: sizes must match")


class Mailbox:
    """Sends, receives and control frames over the p2p channels of a mesh."""

    def __init__(self, rank: int, channels: list[Channel | None], on_event: EventHandler,
                 name: str = "") -> None:
        self.rank = rank
        self._channels = channels
        self._on_event = on_event
        self._cond = threading.Condition()
        self._posted: list[_Posted] = []
        self._arrived: list[_Arrived] = []
        self._error: BaseException | None = None
        self._peer_errors: dict[int, BaseException] = {}
        self._send_locks = [threading.Lock() for _ in channels]
        self._sent = [0] * len(channels)
        self._arrived_count = [0] * len(channels)
        self._delivered = [0] * len(channels)
        self._threads = [
            threading.Thread(target=self._read_loop, args=(peer, ch), daemon=True,
                             name=f"ringtorch-p2p-{name}-{rank}<-{peer}")
            for peer, ch in enumerate(channels) if ch is not None
        ]

    def start(self) -> None:
        """Start the reader threads."""
        for thread in self._threads:
            thread.start()

    def statistics(self) -> MailboxStatistics:
        """A consistent snapshot of the counters and queues (see MailboxStatistics)."""
        with self._cond:
            return MailboxStatistics(
                sent=tuple(self._sent), arrived=tuple(self._arrived_count),
                delivered=tuple(self._delivered), buffered=len(self._arrived),
                waiting_receives=len(self._posted), failed=self._error is not None,
                gone_peers=tuple(sorted(self._peer_errors)))

    # -- sending -----------------------------------------------------------------------------

    def send(self, dst: int, tag: int, payload: BytesLike, deadline: float | None) -> None:
        """Send one message; returns once the kernel has it (the peer's reader drains it).

        Raises:
            PeerClosedError: the peer is gone. DeadlineExceeded: not sent by ``deadline``
            (the stream is then broken; the caller aborts the group).
        """
        lock = self._send_locks[dst]
        timeout = -1 if deadline is None else max(0.0, deadline - time.monotonic())
        if not lock.acquire(timeout=timeout):
            raise DeadlineExceeded(f"timed out waiting to send to rank {dst}")
        try:
            header = P2P_HEADER.pack(DATA, tag, len(memoryview(payload).cast("B")))
            self._channels[dst].send((header, payload), deadline)  # type: ignore[union-attr]
            self._sent[dst] += 1  # under the peer's send lock
        finally:
            lock.release()

    def send_control(self, dst: int, kind: int, payload: bytes = b"",
                     timeout: float = 1.0) -> bool:
        """Best-effort control frame (never blocks past ``timeout``); True when sent."""
        lock = self._send_locks[dst]
        if not lock.acquire(timeout=timeout):
            return False
        try:
            header = P2P_HEADER.pack(kind, 0, len(payload))
            self._channels[dst].send((header, payload),  # type: ignore[union-attr]
                                     time.monotonic() + timeout)
            return True
        except (PeerClosedError, DeadlineExceeded, OSError):
            return False
        finally:
            lock.release()

    # -- receiving ---------------------------------------------------------------------------

    def recv(self, into: BytesLike, src: int | None, tag: int, deadline: float | None) -> int:
        """Receive the next message from ``src`` (any peer when None) with ``tag``.

        Returns:
            The sender's rank.

        Raises:
            RecvError: the group failed, the peer is gone, or the sizes differ (``.error``
                is the exception to raise).
            DeadlineExceeded: nothing matched before ``deadline``.
        """
        view = memoryview(into).cast("B")
        with self._cond:
            if self._error is not None:
                raise RecvError(self._error)
            arrived = next((a for a in self._arrived if a.tag == tag
                            and (src is None or a.src == src)), None)
            if arrived is not None:  # sent before its sender left: still delivered
                self._arrived.remove(arrived)
            else:
                self._raise_if_failed(src)
                posted = _Posted(src, tag, view)
                self._posted.append(posted)
        if arrived is not None:
            return self._take(arrived, view, deadline)
        return self._wait_posted(posted, deadline)

    def _raise_if_failed(self, src: int | None) -> None:
        if self._error is not None:
            raise RecvError(self._error)
        if src is not None and src in self._peer_errors:
            raise RecvError(self._peer_errors[src])

    def _take(self, arrived: _Arrived, view: memoryview, deadline: float | None) -> int:
        with self._cond:
            while not arrived.complete:
                if self._error is not None:
                    raise RecvError(self._error)
                if not self._cond.wait(_remaining(deadline)) and _expired(deadline):
                    raise DeadlineExceeded(f"timed out receiving from rank {arrived.src}")
        with self._cond:
            self._delivered[arrived.src] += 1
        if len(arrived.data) != len(view):
            raise RecvError(_size_error(arrived.src, arrived.tag, len(arrived.data), len(view)))
        view[:] = arrived.data
        return arrived.src

    def _wait_posted(self, posted: _Posted, deadline: float | None) -> int:
        while not posted.event.wait(_remaining(deadline)):
            if not _expired(deadline):
                continue
            with self._cond:
                if posted in self._posted:  # not claimed by a reader yet: give up cleanly
                    self._posted.remove(posted)
                    who = "any rank" if posted.src is None else f"rank {posted.src}"
                    raise DeadlineExceeded(f"timed out receiving from {who} (tag {posted.tag})")
            deadline = None  # a reader is filling the buffer now: wait for it to finish
        if posted.error is not None:
            raise RecvError(posted.error)
        return posted.sender

    # -- reader threads ----------------------------------------------------------------------

    def _read_loop(self, peer: int, ch: Channel) -> None:
        header = bytearray(P2P_HEADER.size)
        try:
            while True:
                ch.recv_into(header)
                kind, tag, nbytes = P2P_HEADER.unpack(header)
                if kind == DATA:
                    self._read_data(peer, ch, tag, nbytes)
                    continue
                if kind not in KIND_NAMES or nbytes > MAX_CONTROL_NBYTES:
                    raise PeerClosedError(f"rank {peer} sent a malformed p2p frame "
                                          f"(kind {kind}, {nbytes} bytes)")
                payload = bytearray(nbytes)
                ch.recv_into(payload)
                self._on_event(peer, KIND_NAMES[kind], bytes(payload))
        except PeerUnreachableError as exc:
            self._on_event(peer, "unreachable", exc.reason.encode())
        except PeerClosedError as exc:
            self._on_event(peer, "eof", str(exc).encode())
        except BaseException as exc:  # a reader must report, never die silently
            self._on_event(peer, "eof", f"reader failed: {exc!r}".encode())

    def _read_data(self, peer: int, ch: Channel, tag: int, nbytes: int) -> None:
        with self._cond:
            self._arrived_count[peer] += 1
            posted = next((p for p in self._posted if p.tag == tag
                           and (p.src is None or p.src == peer)), None)
            if posted is not None:
                self._posted.remove(posted)
            else:
                arrived = _Arrived(peer, tag, nbytes)
                self._arrived.append(arrived)
        if posted is None:
            ch.recv_into(arrived.data)
            with self._cond:
                arrived.complete = True
                self._cond.notify_all()
            return
        try:
            if len(posted.view) == nbytes:
                ch.recv_into(posted.view)
            else:
                ch.recv_into(bytearray(nbytes))
                posted.error = _size_error(peer, tag, nbytes, len(posted.view))
            posted.sender = peer
            with self._cond:
                self._delivered[peer] += 1
        except BaseException as exc:
            posted.error = exc
            raise
        finally:
            posted.event.set()

    # -- failure and shutdown ----------------------------------------------------------------

    def fail(self, error: BaseException) -> None:
        """Fail every pending and later receive with ``error``."""
        with self._cond:
            if self._error is None:
                self._error = error
            posted, self._posted = self._posted, []
            self._cond.notify_all()
        for p in posted:
            p.error = error
            p.event.set()

    def fail_peer(self, peer: int, error: BaseException) -> None:
        """Fail pending and later receives naming ``peer`` as source (it left the group)."""
        with self._cond:
            self._peer_errors.setdefault(peer, error)
            hit = [p for p in self._posted if p.src == peer]
            self._posted = [p for p in self._posted if p.src != peer]
        for p in hit:
            p.error = error
            p.event.set()

    def join(self, timeout: float) -> None:
        """Wait for the reader threads to end (after the channels were shut down)."""
        end = time.monotonic() + timeout
        for thread in self._threads:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(max(0.0, end - time.monotonic()))


def _remaining(deadline: float | None) -> float | None:
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline


__all__ = ["ABORT", "ABORT_LOST", "BYE", "DATA", "P2P_HEADER", "STATUS", "STATUS_REQ", "Mailbox",
           "MailboxStatistics", "RecvError"]

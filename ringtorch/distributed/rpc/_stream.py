"""Whole RPC messages in and out of a stream socket, with as few system calls as possible.

Reading: ``MessageReader`` pulls bytes into a per-connection buffer (a small message is one
``recv``), hands out the pickle as a view of that buffer, reads large out-of-band buffers
straight into fresh arrays (``recv_into``), and copies buffers sent by reference out of the
peer's memory (_cma.py). Sending: ``send_message`` writes header, buffer table, pickle and
the raw buffers with one ``sendmsg`` (scatter-gather, no concatenation). Sockets stay in
blocking mode; deadlines are kept with ``poll``.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from typing import Any

import numpy as np

from ringtorch._wire.errors import DeadlineExceeded, PeerClosedError, unreachable
from ringtorch._wire.framing import advance_views
from ringtorch.distributed.rpc import _cma, messages
from ringtorch.distributed.rpc._serialization import Encoded
from ringtorch.distributed.rpc.messages import BUFFER_ENTRY, HEADER, Header, unpack_header

_CAPACITY = 256 * 1024
_POLLIN = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR
_POLLOUT = select.POLLOUT | select.POLLHUP | select.POLLERR


class StalledError(PeerClosedError):
    """A message stopped arriving half way past the deadline: the stream is unusable."""


class Message:
    """One received message: its header, its pickle and its out-of-band buffers.

    ``data`` may be a view of the reader's buffer: load it before the next ``read``.
    """

    __slots__ = ("buffers", "data", "header")

    def __init__(self, header: Header, data: Any, buffers: list[np.ndarray]) -> None:
        self.header = header
        self.data = data
        self.buffers = buffers


class MessageReader:
    """Reads whole messages from a blocking stream socket."""

    def __init__(self, sock: socket.socket, peer: str, cma_pid: int | None = None,
                 spin_max_s: float = 0.0) -> None:
        self.sock = sock
        self.peer = peer
        self.cma_pid = cma_pid  # the peer's pid when we may read its memory
        self.spin_max_s = spin_max_s
        self._spin_s = spin_max_s
        self._skipped = 0
        self._buf = bytearray(_CAPACITY)
        self._view = memoryview(self._buf)
        self._start = 0
        self._end = 0
        self._poller = select.poll()
        self._poller.register(sock.fileno(), _POLLIN)

    def _recv(self, flags: int = 0) -> int:
        try:
            n = self.sock.recv_into(self._view[self._end:], 0, flags)
        except (ConnectionResetError, ConnectionAbortedError) as exc:
            raise PeerClosedError(f"connection to {self.peer} was reset ({exc})") from exc
        except OSError as exc:
            if isinstance(exc, BlockingIOError):
                raise
            raise broken(self.peer, "receiving", exc) from exc
        if n == 0:
            raise PeerClosedError(f"connection to {self.peer} was closed")
        self._end += n
        return n

    def _wait_readable(self, deadline: float | None, mid_message: bool) -> None:
        if deadline is None:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not self._poller.poll(max(0.0, remaining) * 1000.0):
            if mid_message:
                raise StalledError(f"{self.peer} stopped sending in the middle of a message")
            raise DeadlineExceeded(f"no message from {self.peer} before the deadline")

    def spin(self) -> bool:
        """Try non-blocking reads for a while before a blocking wait; True once bytes arrived.

        Spinning saves the 30-60 µs wake-up of a blocked thread when the peer answers from
        another core, and costs the peer time when it shares our core (a loaded machine).
        So the spin is adaptive: a spin that catches its message keeps the full budget
        (``spin_max_s``), one that does not halves it, down to none; with none, one wait in
        32 spins the full budget again, to notice when spinning pays again.
        """
        if self._end > self._start:
            return True
        budget = self._spin_s
        if budget <= 0.0:
            self._skipped += 1
            if self._skipped < 32 or self.spin_max_s <= 0.0:
                return False
            self._skipped = 0
            budget = self.spin_max_s
        if self._end == _CAPACITY:
            self._compact()
        stop = time.perf_counter() + budget
        while True:
            try:
                self._recv(socket.MSG_DONTWAIT)
                self._spin_s = self.spin_max_s
                return True
            except BlockingIOError:
                if time.perf_counter() >= stop:
                    self._spin_s = budget / 2 if budget > self.spin_max_s / 8 else 0.0
                    return False

    def _compact(self) -> None:
        size = self._end - self._start
        if self._start:
            self._buf[:size] = self._buf[self._start:self._end]
        self._start, self._end = 0, size

    def _ensure(self, nbytes: int, deadline: float | None, mid_message: bool) -> None:
        if self._end - self._start >= nbytes:
            return
        if self._start + nbytes > _CAPACITY:
            self._compact()
        while self._end - self._start < nbytes:
            self._wait_readable(deadline, mid_message or self._end > self._start)
            self._recv()

    def _take(self, nbytes: int) -> memoryview:
        view = self._view[self._start:self._start + nbytes]
        self._start += nbytes
        if self._start == self._end:
            self._start = self._end = 0
        return view

    def _read_into(self, dest: memoryview, deadline: float | None) -> None:
        got = min(len(dest), self._end - self._start)
        if got:
            dest[:got] = self._take(got)
        while got < len(dest):
            self._wait_readable(deadline, True)
            try:
                n = self.sock.recv_into(dest[got:])
            except OSError as exc:
                raise broken(self.peer, "receiving", exc) from exc
            if n == 0:
                raise PeerClosedError(f"connection to {self.peer} was closed after {got} of "
                                      f"{len(dest)} bytes of a message")
            got += n

    def read(self, deadline: float | None = None) -> Message:
        """The next whole message.

        Raises:
            DeadlineExceeded: no byte of a new message arrived before ``deadline``.
            StalledError: a message began but did not finish before ``deadline``.
            PeerClosedError: the connection closed or failed.
            ValueError: the bytes are not an RPC message (the stream is unusable).
        """
        self._ensure(HEADER.size, deadline, False)
        header = unpack_header(self._take(HEADER.size))
        table: tuple[int, ...] = ()
        if header.nbuffers:
            raw = self._read_bytes(header.nbuffers * BUFFER_ENTRY.size, deadline)
            table = struct.unpack(f"<{2 * header.nbuffers}Q", raw)
        data = self._read_bytes(header.pickle_nbytes, deadline)
        buffers = []
        for nbytes, address in zip(table[0::2], table[1::2], strict=True):
            arr = np.empty(nbytes, dtype=np.uint8)
            if address:
                self._copy_from_peer(address, arr)
            elif nbytes:
                self._read_into(arr.data, deadline)
            buffers.append(arr)
        return Message(header, data, buffers)

    def _copy_from_peer(self, address: int, dest: np.ndarray) -> None:
        if self.cma_pid is None:
            raise ValueError(f"{self.peer} sent a memory reference this process cannot read")
        try:
            _cma.read_into(self.cma_pid, address, dest)
        except OSError as exc:
            raise PeerClosedError(f"reading a tensor from {self.peer}'s memory failed "
                                  f"({exc})") from exc

    def _read_bytes(self, nbytes: int, deadline: float | None) -> Any:
        if nbytes <= _CAPACITY:
            self._ensure(nbytes, deadline, True)
            return self._take(nbytes)
        out = bytearray(nbytes)
        self._read_into(memoryview(out), deadline)
        return out


def broken(peer: str, what: str, exc: OSError) -> PeerClosedError:
    """The error of a connection an OSError broke: PeerUnreachableError when the network
    broke it (a timeout, no route), else PeerClosedError (reset, closed)."""
    return unreachable(peer, what, exc) or PeerClosedError(
        f"connection to {peer} failed while {what} ({exc})")


def send_message(sock: socket.socket, parts: list[Any], deadline: float | None,
                 peer: str) -> None:
    """Write every part, in order, with ``sendmsg``; blocks (up to ``deadline``) while the
    socket buffer is full.

    Raises:
        PeerClosedError: the connection is closed or broken.
        DeadlineExceeded: nothing was sent before ``deadline`` (the stream is intact).
        StalledError: part of the message was sent before ``deadline`` passed.
    """
    sent = 0
    if len(parts) <= 64:  # IOV_MAX is larger; past 64 buffers, send them in batches
        try:
            sent = sock.sendmsg(parts, [], socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass
        except OSError as exc:
            raise broken(peer, "sending", exc) from exc
    if sent < sum(map(len, parts)):  # every part is bytes or a byte-format memoryview
        _send_rest(sock, parts, sent, deadline, peer)


def _send_rest(sock: socket.socket, parts: list[Any], sent: int, deadline: float | None,
               peer: str) -> None:
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    poller: Any = None
    sent_any = sent > 0
    while True:
        advance_views(views, sent)
        sent = 0
        if not views:
            return
        if poller is None:
            poller = select.poll()
            poller.register(sock.fileno(), _POLLOUT)
        wait_ms = None if deadline is None else max(0.0, deadline - time.monotonic()) * 1000.0
        if not poller.poll(wait_ms) and deadline is not None:
            if sent_any:
                raise StalledError(f"{peer} stopped reading in the middle of a message")
            raise DeadlineExceeded(f"{peer} did not accept a message before the deadline")
        try:
            sent = sock.sendmsg(views[:64], [], socket.MSG_DONTWAIT)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            raise broken(peer, "sending", exc) from exc
        sent_any = sent_any or sent > 0


def message_from_parts(parts: list[Any]) -> Message:
    """The message that ``[header + buffer table, pickle, *buffers]`` encodes, with private
    copies of its bytes: how a worker delivers a message to itself."""
    header = unpack_header(bytes(parts[0][:HEADER.size]))
    buffers = [np.frombuffer(p, dtype=np.uint8).copy() for p in parts[2:]]
    return Message(header, bytes(parts[1]), buffers)


def build_parts(kind: int, flags: int, message_id: int, ids: tuple[int, int],
                encoded: Encoded, by_reference: bool) -> tuple[list[Any], bool]:
    """The message's parts for ``send_message``, and whether some buffers went by
    reference (their address only: the sender must hold them, see _cma.py)."""
    buffers = encoded.buffers
    head = messages.pack_header(kind, flags, len(encoded.data), message_id, ids[0], ids[1],
                                len(buffers))
    if not buffers:
        return [head, encoded.data], False
    entries, inline, referenced = [], [], False
    for buf in buffers:
        if by_reference and buf.nbytes >= _cma.MIN_NBYTES:
            entries.append(messages.BUFFER_ENTRY.pack(buf.nbytes, _cma.address_of(buf)))
            referenced = True
        else:
            entries.append(messages.BUFFER_ENTRY.pack(buf.nbytes, 0))
            inline.append(buf)
    return [head + b"".join(entries), encoded.data, *inline], referenced

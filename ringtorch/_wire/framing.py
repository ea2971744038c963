"""Length-prefixed frames and exact reads over a blocking stream socket.

A frame is a little-endian u32 byte count followed by that many bytes. The reader gives a cap
on the count before it allocates anything, so a peer cannot make us allocate 4 GiB with four
bytes. Bulk data (tensors) does not go through ``recv_frame``: callers read a header and then
``recv_into`` the destination memory directly.

Layout (little-endian):
    offset 0  u32  nbytes   length of the payload
    offset 4  ...  payload, nbytes bytes
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence

from ringtorch._wire.errors import DeadlineExceeded, PeerClosedError

FRAME_LENGTH = struct.Struct("<I")

BytesLike = bytes | bytearray | memoryview


def _set_deadline(sock: socket.socket, deadline: float | None, peer: str) -> None:
    if deadline is None:
        sock.settimeout(None)
        return
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise DeadlineExceeded(f"timed out talking to {peer}")
    sock.settimeout(remaining)


def advance_views(views: list[memoryview], sent: int) -> None:
    """Drop the first ``sent`` bytes from a list of byte views, in place (after a partial
    ``sendmsg``: whole views that went out are popped, the first one left is sliced)."""
    while sent:
        head = views[0]
        if sent >= len(head):
            sent -= len(head)
            views.pop(0)
        else:
            views[0] = head[sent:]
            sent = 0


def send_all(sock: socket.socket, buffers: Sequence[BytesLike], deadline: float | None = None,
             peer: str = "peer") -> None:
    """Send every buffer, in order, with as few system calls as the kernel allows.

    Raises:
        PeerClosedError: the peer closed or reset the connection.
        DeadlineExceeded: the data was not all sent before ``deadline``.
    """
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    try:
        while views:
            _set_deadline(sock, deadline, peer)
            advance_views(views, sock.sendmsg(views[:64]))
    except TimeoutError as exc:
        raise DeadlineExceeded(f"timed out sending to {peer}") from exc
    except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError) as exc:
        raise PeerClosedError(f"connection to {peer} was closed while sending ({exc})") from exc


def recv_into_exactly(sock: socket.socket, buf: BytesLike, deadline: float | None = None,
                      peer: str = "peer") -> None:
    """Fill ``buf`` completely from the socket.

    Raises:
        PeerClosedError: EOF or reset before ``buf`` was full; the message names the peer.
        DeadlineExceeded: ``buf`` was not filled before ``deadline``.
    """
    view = memoryview(buf).cast("B")
    got = 0
    total = len(view)
    try:
        while got < total:
            _set_deadline(sock, deadline, peer)
            n = sock.recv_into(view[got:])
            if n == 0:
                raise PeerClosedError(
                    f"connection to {peer} was closed after {got} of {total} expected bytes"
                )
            got += n
    except TimeoutError as exc:
        raise DeadlineExceeded(
            f"timed out receiving from {peer} ({got} of {total} bytes arrived)"
        ) from exc
    except (ConnectionResetError, ConnectionAbortedError) as exc:
        raise PeerClosedError(f"connection to {peer} was reset ({exc})") from exc


def recv_exactly(sock: socket.socket, nbytes: int, deadline: float | None = None,
                 peer: str = "peer") -> bytearray:
    """Read exactly ``nbytes`` into a new bytearray (see :func:`recv_into_exactly`)."""
    buf = bytearray(nbytes)
    recv_into_exactly(sock, buf, deadline, peer)
    return buf


def send_frame(sock: socket.socket, payload: BytesLike, deadline: float | None = None,
               peer: str = "peer") -> None:
    """Send one length-prefixed frame."""
    send_all(sock, [FRAME_LENGTH.pack(len(payload)), payload], deadline, peer)


def recv_frame(sock: socket.socket, max_nbytes: int, deadline: float | None = None,
               peer: str = "peer") -> bytearray:
    """Receive one length-prefixed frame of at most ``max_nbytes`` payload bytes.

    Raises:
        ValueError: the announced length is over ``max_nbytes`` (the stream is then unusable).
        PeerClosedError, DeadlineExceeded: as :func:`recv_into_exactly`.
    """
    (nbytes,) = FRAME_LENGTH.unpack(recv_exactly(sock, FRAME_LENGTH.size, deadline, peer))
    if nbytes > max_nbytes:
        raise ValueError(f"{peer} announced a frame of {nbytes} bytes; at most {max_nbytes} allowed")
    return recv_exactly(sock, nbytes, deadline, peer)


__all__ = [
    "FRAME_LENGTH",
    "advance_views",
    "recv_exactly",
    "recv_frame",
    "recv_into_exactly",
    "send_all",
    "send_frame",
]

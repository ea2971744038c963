"""RPC message layout, message kinds and the registry of message handlers.

Every RPC message is one header, a table of out-of-band buffer sizes, the pickle (protocol 5)
and the raw out-of-band buffers (tensor and NumPy array bytes, straight from their memory):

    HEADER (little-endian, 40 bytes)
        offset  0  2s   magic b"RP": a desynchronised stream is caught at once
        offset  2  u8   kind: a request kind below, or RESPONSE / RESPONSE_ERROR
        offset  3  u8   flags (FLAG_*)
        offset  4  u32  pickle_nbytes
        offset  8  u64  message_id: chosen by the sender of a request; its response repeats it
        offset 16  i64  context_id: distributed autograd context, -1 when none
        offset 24  i64  context_message_id: autograd send/recv pair id, -1 when none
        offset 32  u32  nbuffers: out-of-band buffers after the pickle
        offset 36  u32  reserved, 0
    BUFFER TABLE  nbuffers x (u64 nbytes, u64 address)
    PICKLE        pickle_nbytes bytes
    BUFFERS       the buffers whose address is 0, back to back

A buffer with a non-zero address is not in the stream: the receiver copies ``nbytes`` from
that address in the sender's memory (same host, _cma.py); the sender keeps it alive until
the reply to its request, or until RELEASE_HOLD answers its reply (FLAG_WANTS_RELEASE).

A request travels on the sender's outgoing connection to the destination and its response
comes back on the same socket; one-way messages (FLAG_ONE_WAY) get no response. Requests are
read, and their pickles loaded, in the order they were sent on a connection.

Handlers are registered per request kind in extensions.py, so later layers add kinds without
touching the agent: distributed autograd registers its own (kinds 32-63 are kept for it) and
stamps ``context_id`` / ``context_message_id`` through the agent's autograd hook (see
docs/design/rref-protocol.md, "Extension points").
"""

from __future__ import annotations

import struct

MAGIC = b"RP"
HEADER = struct.Struct("<2sBBIQqqII")
BUFFER_ENTRY = struct.Struct("<QQ")
assert HEADER.size == 40

# Request kinds (1-31: the RPC framework; 32-63: distributed autograd; 64+: responses).
CALL = 1                 # run a Python function, reply with its value
REMOTE_CALL = 2          # run a function, keep the value on the callee as an OwnerRRef
RREF_FETCH = 3           # to_here(): reply with the value of an OwnerRRef
RREF_FORK_REQUEST = 4    # a user received a fork; the owner records the new user
RREF_CHILD_ACCEPT = 5    # one-way: the owner knows the child, the parent may drop its hold
RREF_USER_DELETE = 6     # one-way: a batch of user references that are gone
RELEASE_HOLD = 7         # one-way: a response carrying the receiver's RRefs was loaded
SHUTDOWN_REPORT = 8      # graceful shutdown: one worker's message counters for one round
RESPONSE = 64
RESPONSE_ERROR = 65

FLAG_ONE_WAY = 1         # no response is sent
FLAG_WANTS_RELEASE = 2   # a reply the sender holds RRefs or memory for: answer RELEASE_HOLD

MAX_BUFFERS = 1 << 20

KIND_NAMES = {
    CALL: "CALL", REMOTE_CALL: "REMOTE_CALL", RREF_FETCH: "RREF_FETCH",
    RREF_FORK_REQUEST: "RREF_FORK_REQUEST", RREF_CHILD_ACCEPT: "RREF_CHILD_ACCEPT",
    RREF_USER_DELETE: "RREF_USER_DELETE", RELEASE_HOLD: "RELEASE_HOLD",
    SHUTDOWN_REPORT: "SHUTDOWN_REPORT", RESPONSE: "RESPONSE", RESPONSE_ERROR: "RESPONSE_ERROR",
}


class Header:
    """The fixed fields of one message."""

    __slots__ = ("context_id", "context_message_id", "flags", "kind", "message_id", "nbuffers",
                 "pickle_nbytes")

    def __init__(self, kind: int, flags: int, pickle_nbytes: int, message_id: int,
                 context_id: int = -1, context_message_id: int = -1, nbuffers: int = 0) -> None:
        self.kind = kind
        self.flags = flags
        self.pickle_nbytes = pickle_nbytes
        self.message_id = message_id
        self.context_id = context_id
        self.context_message_id = context_message_id
        self.nbuffers = nbuffers


def pack_header(kind: int, flags: int, pickle_nbytes: int, message_id: int,
                context_id: int, context_message_id: int, nbuffers: int) -> bytes:
    """The 40 header bytes of a message."""
    return HEADER.pack(MAGIC, kind, flags, pickle_nbytes, message_id, context_id,
                       context_message_id, nbuffers, 0)


def unpack_header(data: bytes | bytearray | memoryview) -> Header:
    """Decode the 40 header bytes.

    Raises:
        ValueError: bad magic or an absurd buffer count (the stream is unusable).
    """
    magic, kind, flags, nbytes, message_id, ctx, ctx_msg, nbuffers, _ = HEADER.unpack(data)
    if magic != MAGIC:
        raise ValueError(f"bad RPC message magic {bytes(magic)!r} (expected {MAGIC!r})")
    if nbuffers > MAX_BUFFERS:
        raise ValueError(f"RPC message announces {nbuffers} buffers; at most {MAX_BUFFERS}")
    return Header(kind, flags, nbytes, message_id, ctx, ctx_msg, nbuffers)


__all__ = [
    "BUFFER_ENTRY",
    "CALL",
    "FLAG_ONE_WAY",
    "FLAG_WANTS_RELEASE",
    "HEADER",
    "Header",
    "REMOTE_CALL",
    "RESPONSE",
    "RESPONSE_ERROR",
]

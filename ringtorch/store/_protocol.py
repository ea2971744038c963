"""The TCPStore wire protocol: request and response frames, as named structs.

The store carries bytes only. A frame is a fixed little-endian head followed by ``nfields``
length-prefixed byte strings (keys and values); nothing the server receives is ever unpickled,
evaluated or decoded beyond these lengths. Every connection first runs the ringtorch handshake
(``ringtorch._wire.handshake``, service SERVICE_STORE); these frames follow it.

Request (client -> server), REQUEST_HEAD then the fields:

    offset  0  u32  nbytes      bytes of fields after this 24-byte head
    offset  4  u32  request_id  echoed in the response (one request in flight per connection)
    offset  8  u8   op          OP_* below
    offset  9  u8   flags       0 (reserved)
    offset 10  u16  nfields     number of fields after the head
    offset 12  u32  timeout_ms  how long the server may park a blocking op (GET, WAIT, ...)
    offset 16  i64  arg         integer argument: ADD amount, QUEUE_POP block flag, WAIT_COUNT n
    offset 24  ...  nfields x (u32 length, that many bytes)

Response (server -> client), RESPONSE_HEAD then the fields:

    offset  0  u32  nbytes      bytes of fields after this 20-byte head
    offset  4  u32  request_id  the request's id
    offset  8  u8   status      STATUS_* below
    offset  9  u8   reserved    0
    offset 10  u16  nfields     number of fields after the head
    offset 12  i64  value       integer result: ADD's new value, NUM_KEYS, CHECK/DELETE (0/1),
                                QUEUE_LEN; on STATUS_TIMEOUT of WAIT_COUNT the count reached;
                                on STATUS_ERROR the error kind (ERROR_*)
    offset 20  ...  nfields x (u32 length, that many bytes)

A request the server cannot parse (unknown op, a length over the caps, fields that do not add
up to ``nbytes``) closes that connection; the server keeps serving everyone else.
"""

from __future__ import annotations

import struct

REQUEST_HEAD = struct.Struct("<IIBBHIq")
RESPONSE_HEAD = struct.Struct("<IIBBHq")
FIELD_LENGTH = struct.Struct("<I")

# Ops. Fields are listed in order; "blocks" ops are parked by the server until ready or timeout;
# "no answer" ops are not answered at all (as in torch): the client does not wait for them, and
# the order of one connection's requests keeps its later reads consistent with them.
OP_SET = 1            # key, value                                      (no answer)
OP_GET = 2            # key                      -> value               (blocks)
OP_ADD = 3            # key; arg = amount        -> value = new integer
OP_COMPARE_SET = 4    # key, expected, desired   -> the value after the op
OP_WAIT = 5           # key...                                          (blocks)
OP_CHECK = 6          # key...                   -> value = 1 when all exist
OP_DELETE = 7         # key                      -> value = 1 when it existed
OP_NUM_KEYS = 8       #                          -> value = number of keys
OP_MULTI_GET = 9      # key...                   -> one value per key   (blocks)
OP_MULTI_SET = 10     # key, value, key, value...                        (no answer)
OP_APPEND = 11        # key, value                                      (no answer)
OP_LIST_KEYS = 12     #                          -> every user key
OP_QUEUE_PUSH = 13    # key, value                                      (no answer)
OP_QUEUE_POP = 14     # key; arg = 1 to block    -> the oldest value    (blocks when arg = 1)
OP_QUEUE_LEN = 15     # key                      -> value = length
OP_WAIT_COUNT = 16    # key; arg = n             -> OK once int(value) >= n (blocks)
OP_PING = 17          #                          -> OK
MAX_OP = OP_PING
# op code -> the name statistics() reports it under
OP_NAMES = {code: name[3:].lower() for name, code in list(globals().items())
            if name.startswith("OP_")}
NO_ANSWER_OPS = frozenset({OP_SET, OP_MULTI_SET, OP_APPEND, OP_QUEUE_PUSH})

STATUS_OK = 0
STATUS_TIMEOUT = 1
STATUS_ERROR = 2       # fields[0] is a UTF-8 message, value the ERROR_* kind
STATUS_QUEUE_EMPTY = 3

ERROR_VALUE = 1        # raised on the client as ValueError (e.g. add on a non-integer value)
ERROR_STORE = 2        # raised on the client as DistStoreError

MAX_KEY_NBYTES = 64 * 1024
MAX_FIELDS = 0xFFFF
MAX_TIMEOUT_MS = 0xFFFFFFFF
# Bytes of keys, lengths and slack a request may carry on top of the value cap.
FRAME_SLACK_NBYTES = 1024 * 1024


def encode_fields(fields: list[bytes]) -> list[bytes]:
    """The field section of a frame as a list of buffers: (length, bytes) for each field."""
    parts: list[bytes] = [b""] * (2 * len(fields))
    parts[0::2] = map(FIELD_LENGTH.pack, map(len, fields))  # whole-list steps, no Python loop
    parts[1::2] = fields
    return parts


def decode_fields(body: bytes | bytearray | memoryview, nfields: int) -> list[bytes] | None:
    """Split a field section into its fields; None when the lengths do not add up."""
    if not isinstance(body, bytes):
        body = bytes(body)  # one copy: every field is then a plain slice of it
    fields: list[bytes] = []
    append = fields.append
    offset = 0
    end = len(body)
    unpack_from = FIELD_LENGTH.unpack_from
    for _ in range(nfields):
        if offset + 4 > end:
            return None
        start = offset + 4
        offset = start + unpack_from(body, offset)[0]
        if offset > end:
            return None
        append(body[start:offset])
    if offset != end:
        return None
    return fields


def timeout_ms(seconds: float) -> int:
    """A timeout in seconds as the u32 milliseconds of the wire (rounded up, capped)."""
    return min(MAX_TIMEOUT_MS, max(0, int(seconds * 1000.0 + 0.999)))

"""The TCPStore server's request parser: complete frames out of the bytes one read brought.

``RequestParser`` (mixed into the server, over ``StoreOps``) splits what a connection sent into
request frames (``_protocol.py``) and applies each. The most frequent requests (set; get or
wait of one present key; add) are served inline, with the same effect as their handlers in
``_tcp_ops.py``: on a busy store the per-frame cost in Python is what bounds the rate of sets.
The rule kept: a frame is applied only once it is whole and its lengths add up; anything else
raises ``ProtocolError`` and the server closes that connection.
"""

from __future__ import annotations

import struct

from ringtorch.store import _protocol as P
from ringtorch.store._tcp_ops import ARITY, Conn, Handler, StoreOps

_OP_SET, _OP_GET, _OP_ADD, _OP_WAIT = P.OP_SET, P.OP_GET, P.OP_ADD, P.OP_WAIT
_STATUS_OK = P.STATUS_OK
_pack_answer = P.RESPONSE_HEAD.pack
_ONE_FIELD_ANSWER = struct.Struct(P.RESPONSE_HEAD.format + "I")  # head + the field's length
_KEY_HEAD = struct.Struct(P.REQUEST_HEAD.format + "I")  # a head + its first field's length
HEAD_SIZE, _KEY_HEAD_SIZE = P.REQUEST_HEAD.size, _KEY_HEAD.size
# Field sections of this many bytes are decoded once per distinct content (a wait for the
# records of hundreds of ranks and up); at most _SHARED_SECTIONS of them are remembered.
_SHARED_MIN_NBYTES, _SHARED_MAX_NBYTES, _SHARED_SECTIONS = 4096, 1024 * 1024, 64


class ProtocolError(Exception):
    """The client sent something that is not a valid request; its connection is closed."""


class RequestParser(StoreOps):
    """Parsing and the inline hot paths (mixed into StoreServer, which provides the rest)."""

    _max_frame: int
    _handlers: dict[int, Handler]
    _dirty: list[Conn]
    _decoded: dict[bytes, list[bytes]]  # field section -> its fields (_decode_shared)

    def _parse(self, conn: Conn, data: bytes, total: int) -> int:
        """Serve every complete request in data[:total]; the number of bytes consumed."""
        pos = 0
        unpack_head = P.REQUEST_HEAD.unpack_from
        unpack_key_head = _KEY_HEAD.unpack_from
        unpack_length = P.FIELD_LENGTH.unpack_from
        table = self._table.data
        waiters = self._waiters
        max_frame = self._max_frame
        while total - pos >= HEAD_SIZE and not conn.closed:
            # The head and, when there is one, the first field's length in one call (klen
            # means nothing unless the request has a field: only the fast paths read it).
            if total - pos >= _KEY_HEAD_SIZE:
                nbytes, rid, op, _flags, nfields, tmo, arg, klen = unpack_key_head(data, pos)
            else:
                nbytes, rid, op, _flags, nfields, tmo, arg = unpack_head(data, pos)
                klen = -1
            if nbytes > max_frame:
                raise ProtocolError(f"a request of {nbytes} bytes, over the cap of "
                                     f"{self._max_frame}")
            start = pos + HEAD_SIZE
            end = start + nbytes
            if end > total:
                break
            # The hot paths (set; get or wait of a present key; add), inlined: same effect as
            # their handlers in _tcp_ops.py, without the general machinery.
            if op == _OP_SET and nfields == 2:
                key_end = start + 4 + klen
                if key_end + 4 <= end and key_end + 4 + unpack_length(data, key_end)[0] == end:
                    key = data[start + 4:key_end]
                    table[key] = data[key_end + 4:end]
                    if key in waiters:
                        self._notify(key)
                    pos = end
                    continue
            elif (op == _OP_GET or op == _OP_ADD or op == _OP_WAIT) and nfields == 1 and (
                    klen == nbytes - 4):
                if self._answer_fast(conn, rid, op, data[start + 4:end], arg):
                    pos = end
                    continue
            arity = ARITY.get(op, -1)
            if arity == -1:
                raise ProtocolError(f"unknown op {op}")
            if nbytes >= _SHARED_MIN_NBYTES and nbytes <= _SHARED_MAX_NBYTES:
                fields = self._decode_shared(data[start:end], nfields)
            else:
                fields = P.decode_fields(data[start:end], nfields)
            if fields is None:
                raise ProtocolError("field lengths do not add up to the request size")
            if (arity is not None and nfields != arity) or (
                    op == P.OP_MULTI_SET and nfields % 2):
                raise ProtocolError(f"op {op} with {nfields} fields")
            self._handlers[op](conn, rid, op, fields, tmo, arg)
            pos = end
        return pos

    def _decode_shared(self, section: bytes, nfields: int) -> list[bytes] | None:
        """decode_fields for a big field section, decoded once for every request that sends
        the same bytes (at a job's start every rank asks for the same thousands of keys);
        the lists handed out are never modified."""
        fields = self._decoded.get(section)
        if fields is None or len(fields) != nfields:
            fields = P.decode_fields(section, nfields)
            if fields is not None:
                if len(self._decoded) >= _SHARED_SECTIONS:
                    self._decoded.clear()
                self._decoded[section] = fields
        return fields

    def _answer_fast(self, conn: Conn, rid: int, op: int, key: bytes, arg: int) -> bool:
        """Answer a get or a wait of a present key, or an add, at once; False to take the
        general path."""
        if op == _OP_GET:
            value = self._table.data.get(key)
            if value is None:
                return False
            conn.out.append(_ONE_FIELD_ANSWER.pack(4 + len(value), rid, _STATUS_OK, 0, 1, 0,
                                                   len(value)))
            conn.out.append(value)
        elif op == _OP_WAIT:
            if key not in self._table.data:
                return False  # parked, or a queue's name: the general path
            conn.out.append(_pack_answer(0, rid, _STATUS_OK, 0, 0, 0))
        else:
            try:
                count = self._table.add(key, arg)
            except ValueError:
                return False
            conn.out.append(_pack_answer(0, rid, _STATUS_OK, 0, 0, count))
            if key in self._waiters:
                self._notify(key)
        if not conn.dirty:
            conn.dirty = True
            self._dirty.append(conn)
        return True

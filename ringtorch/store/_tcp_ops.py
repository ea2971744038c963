"""What each TCPStore request does: the ops, and the parking of blocking ones.

``StoreOps`` is the half of the server that knows the store's semantics; ``_tcp_server``
is the half that moves bytes (event loop, sockets, parsing, timers). A blocking request
(``get``, ``wait``, ``multi_get``, ``queue_pop``, ``wait_count``) that is not ready is parked as
a ``Waiter`` on ONE key it lacks; when that key changes it is tried again and either answered
or parked on the next missing key. Nothing polls. A parked request leaves when it is answered,
when its deadline fires (STATUS_TIMEOUT) or when its client goes away.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from ringtorch.store import _protocol as P
from ringtorch.store._table import KeyValueTable

# Number of fields each op takes; None = any number (MULTI_SET: an even number).
ARITY: dict[int, int | None] = {
    P.OP_SET: 2, P.OP_GET: 1, P.OP_ADD: 1, P.OP_COMPARE_SET: 3, P.OP_WAIT: None,
    P.OP_CHECK: None, P.OP_DELETE: 1, P.OP_NUM_KEYS: 0, P.OP_MULTI_GET: None,
    P.OP_MULTI_SET: None, P.OP_APPEND: 2, P.OP_LIST_KEYS: 0, P.OP_QUEUE_PUSH: 2,
    P.OP_QUEUE_POP: 1, P.OP_QUEUE_LEN: 1, P.OP_WAIT_COUNT: 1, P.OP_PING: 0,
}

Handler = Callable[["Conn", int, int, list[bytes], int, int], None]


class Conn:
    """One client connection, as the server loop sees it."""

    __slots__ = ("closed", "dirty", "inbuf", "last_progress", "last_request", "out", "parked",
                 "peer", "sock", "writing")

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.inbuf = bytearray()
        self.out: list[bytes] = []
        self.writing = False
        self.dirty = False
        self.closed = False
        self.parked: set[Waiter] = set()
        self.last_progress = 0.0
        self.last_request = time.monotonic()  # when it last sent bytes (linger's idle test)


class Waiter:
    """A parked blocking request."""

    __slots__ = ("arg", "conn", "done", "index", "keys", "op", "request_id", "watch")

    def __init__(self, conn: Conn, request_id: int, op: int, keys: list[bytes], arg: int):
        self.conn = conn
        self.request_id = request_id
        self.op = op
        self.keys = keys
        self.arg = arg
        self.done = False
        self.index = 0  # keys[:index] were there when last looked at
        self.watch: bytes | None = None


class StoreOps:
    """The ops of the store server (mixed into StoreServer, which provides the I/O)."""

    _table: KeyValueTable
    _waiters: dict[bytes, list[Waiter]]
    _live_timers: int

    def _reply(self, conn: Conn, rid: int, status: int = P.STATUS_OK, value: int = 0,
               fields: list[bytes] | None = None) -> None:
        raise NotImplementedError

    def _push_timer(self, deadline: float, item: object) -> None:
        raise NotImplementedError

    def _op_handlers(self) -> dict[int, Handler]:
        return {
            P.OP_SET: self._op_set, P.OP_GET: self._op_blocking, P.OP_ADD: self._op_add,
            P.OP_COMPARE_SET: self._op_compare_set, P.OP_WAIT: self._op_blocking,
            P.OP_CHECK: self._op_check, P.OP_DELETE: self._op_delete,
            P.OP_NUM_KEYS: self._op_num_keys, P.OP_MULTI_GET: self._op_blocking,
            P.OP_MULTI_SET: self._op_multi_set, P.OP_APPEND: self._op_append,
            P.OP_LIST_KEYS: self._op_list_keys, P.OP_QUEUE_PUSH: self._op_queue_push,
            P.OP_QUEUE_POP: self._op_queue_pop, P.OP_QUEUE_LEN: self._op_queue_len,
            P.OP_WAIT_COUNT: self._op_blocking, P.OP_PING: self._op_ping,
        }

    # ----- parked requests --------------------------------------------------------------

    def _attempt(self, conn: Conn, rid: int, op: int, keys: list[bytes], arg: int,
                 start: int = 0) -> int:
        """Answer a blocking request if it is ready (-1); else the index of the key it must
        watch. Keys before ``start`` were there when last looked at: a wait for thousands of
        keys arriving one by one is scanned once in all, not once per arrival."""
        table = self._table
        data = table.data
        if op == P.OP_GET:
            value = data.get(keys[0])
            if value is None:
                return 0
            self._reply(conn, rid, fields=[value])
        elif op == P.OP_WAIT or op == P.OP_MULTI_GET:
            for begin in (start, 0) if start else (0,):  # then again from 0: keys seen before
                index = self._first_absent(keys, begin, op == P.OP_WAIT)  # may be gone since
                if index >= 0:
                    return index
            if op == P.OP_WAIT:
                self._reply(conn, rid)
            else:
                self._reply(conn, rid, fields=list(map(data.__getitem__, keys)))
        elif op == P.OP_QUEUE_POP:
            value = table.queue_pop(keys[0])
            if value is None:
                return 0
            self._reply(conn, rid, fields=[value])
        else:  # OP_WAIT_COUNT
            count = self._count(keys[0])
            if count < arg:
                return 0
            self._reply(conn, rid, value=count)
        return -1

    def _first_absent(self, keys: list[bytes], start: int, queues_count: bool) -> int:
        """The index of the first key from ``start`` on that the table lacks (a non-empty
        queue counts as there when ``queues_count``), or -1. Looked up in runs of growing
        length with map() rather than a Python loop per key (a job's start asks for the records
        of thousands of ranks), stopping at the run that holds the first one missing."""
        present = self._table.data.__contains__
        step = 16
        while start < len(keys):
            run = list(map(present, keys[start:start + step]))
            if False in run:
                index = start + run.index(False)
                if not (queues_count and self._table.queues.get(keys[index])):
                    return index
                start = index + 1
            else:
                start += step
                step *= 2
        return -1

    def _count(self, key: bytes) -> int:
        try:
            return int(self._table.data.get(key, b"0"))
        except ValueError:
            return 0

    def _op_blocking(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                     arg: int) -> None:
        missing = self._attempt(conn, rid, op, fields, arg)
        if missing < 0:
            return
        waiter = Waiter(conn, rid, op, fields, arg)
        if tmo == 0:
            self._reply(conn, rid, P.STATUS_TIMEOUT, self._timeout_value(waiter))
            return
        conn.parked.add(waiter)
        self._watch(waiter, missing)
        self._live_timers += 1
        self._push_timer(time.monotonic() + tmo / 1000.0, waiter)

    def _watch(self, waiter: Waiter, index: int) -> None:
        waiter.index = index
        waiter.watch = key = waiter.keys[index]
        watchers = self._waiters.get(key)
        if watchers is None:
            self._waiters[key] = [waiter]
        else:
            watchers.append(waiter)

    def _notify(self, key: bytes) -> None:
        watchers = self._waiters.pop(key, None)
        if not watchers:
            return
        for waiter in watchers:
            if waiter.done:
                continue
            missing = self._attempt(waiter.conn, waiter.request_id, waiter.op, waiter.keys,
                                    waiter.arg, waiter.index)
            if missing < 0:
                waiter.done = True
                waiter.conn.parked.discard(waiter)
                self._live_timers -= 1
            else:
                self._watch(waiter, missing)

    def _retire(self, waiter: Waiter) -> None:
        """Forget a parked request (it timed out or its client left)."""
        if waiter.done:
            return
        waiter.done = True
        waiter.conn.parked.discard(waiter)
        self._live_timers -= 1
        key = waiter.watch
        watchers = self._waiters.get(key) if key is not None else None
        if watchers is not None:
            try:
                watchers.remove(waiter)
            except ValueError:
                pass
            if not watchers:
                del self._waiters[key]  # type: ignore[index]

    def _timeout_value(self, waiter: Waiter) -> int:
        return self._count(waiter.keys[0]) if waiter.op == P.OP_WAIT_COUNT else 0

    def _expire(self, waiter: Waiter) -> None:
        self._retire(waiter)
        self._reply(waiter.conn, waiter.request_id, P.STATUS_TIMEOUT, self._timeout_value(waiter))

    # ----- the other ops ----------------------------------------------------------------

    def _op_set(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                arg: int) -> None:
        self._table.data[fields[0]] = fields[1]
        self._notify(fields[0])

    def _op_add(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                arg: int) -> None:
        try:
            value = self._table.add(fields[0], arg)
        except ValueError as exc:
            self._reply(conn, rid, P.STATUS_ERROR, P.ERROR_VALUE, [str(exc).encode()])
            return
        self._reply(conn, rid, value=value)
        self._notify(fields[0])

    def _op_compare_set(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                        arg: int) -> None:
        result, changed = self._table.compare_set(fields[0], fields[1], fields[2])
        self._reply(conn, rid, fields=[result])
        if changed:
            self._notify(fields[0])

    def _op_check(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                  arg: int) -> None:
        self._reply(conn, rid, value=int(self._table.has_all(fields)))

    def _op_delete(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                   arg: int) -> None:
        self._reply(conn, rid, value=int(self._table.delete(fields[0])))

    def _op_num_keys(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                     arg: int) -> None:
        self._reply(conn, rid, value=self._table.num_keys())

    def _op_multi_set(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                      arg: int) -> None:
        data = self._table.data
        keys = fields[0::2]
        for key, value in zip(keys, fields[1::2], strict=True):
            data[key] = value
        for key in keys:
            self._notify(key)

    def _op_append(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                   arg: int) -> None:
        self._table.append(fields[0], fields[1])
        self._notify(fields[0])

    def _op_list_keys(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                      arg: int) -> None:
        keys = self._table.list_keys()
        if len(keys) > P.MAX_FIELDS:
            message = (f"list_keys: the store holds {len(keys)} keys, more than one answer "
                       f"carries ({P.MAX_FIELDS})")
            self._reply(conn, rid, P.STATUS_ERROR, P.ERROR_STORE, [message.encode()])
            return
        self._reply(conn, rid, fields=keys)

    def _op_queue_push(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                       arg: int) -> None:
        self._table.queue_push(fields[0], fields[1])
        self._notify(fields[0])

    def _op_queue_pop(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                      arg: int) -> None:
        if arg:
            self._op_blocking(conn, rid, op, fields, tmo, arg)
            return
        value = self._table.queue_pop(fields[0])
        if value is None:
            self._reply(conn, rid, P.STATUS_QUEUE_EMPTY)
        else:
            self._reply(conn, rid, fields=[value])

    def _op_queue_len(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                      arg: int) -> None:
        self._reply(conn, rid, value=self._table.queue_len(fields[0]))

    def _op_ping(self, conn: Conn, rid: int, op: int, fields: list[bytes], tmo: int,
                 arg: int) -> None:
        self._reply(conn, rid)

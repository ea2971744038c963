"""HashStore: a store inside one process, for threads (torch's ``HashStore``).

Keys live in a KeyValueTable guarded by one condition variable; waiters sleep on it and every
change wakes them, so blocking ``get``/``wait`` never poll. Thread-safe; not shared between
processes (use TCPStore or FileStore for that).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

from ringtorch.store._table import KeyValueTable
from ringtorch.store.base import DEFAULT_TIMEOUT, Store


class HashStore(Store):
    """An in-process, thread-safe store (torch's ``HashStore``)."""

    def __init__(self, timeout: timedelta = DEFAULT_TIMEOUT) -> None:
        super().__init__(timeout)
        self._table = KeyValueTable()
        self._cond = threading.Condition(threading.Lock())

    def _wait_until(self, ready: Callable[[], bool], timeout: timedelta) -> bool:
        return self._cond.wait_for(ready, timeout.total_seconds())

    def _set(self, key: bytes, value: bytes) -> None:
        with self._cond:
            self._table.data[key] = value
            self._cond.notify_all()

    def _get(self, key: bytes, timeout: timedelta) -> bytes | None:
        with self._cond:
            if not self._wait_until(lambda: key in self._table.data, timeout):
                return None
            return self._table.data[key]

    def _add(self, key: bytes, amount: int) -> int:
        with self._cond:
            value = self._table.add(key, amount)
            self._cond.notify_all()
            return value

    def _compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        with self._cond:
            result, changed = self._table.compare_set(key, expected, desired)
            if changed:
                self._cond.notify_all()
            return result

    def _wait(self, keys: list[bytes], timeout: timedelta) -> bool:
        with self._cond:
            return self._wait_until(lambda: self._table.has_all(keys), timeout)

    def _check(self, keys: list[bytes]) -> bool:
        with self._cond:
            return self._table.has_all(keys)

    def _delete_key(self, key: bytes) -> bool:
        with self._cond:
            return self._table.delete(key)

    def _num_keys(self) -> int:
        with self._cond:
            return self._table.num_keys()

    def _multi_get(self, keys: list[bytes], timeout: timedelta) -> list[bytes] | None:
        data = self._table.data
        with self._cond:
            if not self._wait_until(lambda: all(k in data for k in keys), timeout):
                return None
            return [data[k] for k in keys]

    def _multi_set(self, keys: list[bytes], values: list[bytes]) -> None:
        with self._cond:
            self._table.data.update(zip(keys, values, strict=True))
            self._cond.notify_all()

    def _append(self, key: bytes, value: bytes) -> None:
        with self._cond:
            self._table.append(key, value)
            self._cond.notify_all()

    def _list_keys(self) -> list[bytes]:
        with self._cond:
            return self._table.list_keys()

    def _queue_push(self, key: bytes, value: bytes) -> None:
        with self._cond:
            self._table.queue_push(key, value)
            self._cond.notify_all()

    def _queue_pop(self, key: bytes, block: bool, timeout: timedelta) -> bytes | None:
        with self._cond:
            if block and not self._wait_until(lambda: self._table.queue_len(key) > 0, timeout):
                return None
            return self._table.queue_pop(key)

    def _queue_len(self, key: bytes) -> int:
        with self._cond:
            return self._table.queue_len(key)

    def clone(self) -> HashStore:
        """See base class. HashStore is thread-safe, so the clone is the store itself."""
        return self


__all__ = ["HashStore"]

"""PrefixStore: a view of another store where every key is ``f"{prefix}/{key}"``.

Process groups nest them (``default_pg/``, then the group name) so that groups sharing one
TCPStore never see each other's keys. Every operation is delegated to the underlying store's
public API, so any Store works underneath, a user's Python subclass included; timeouts are the
underlying store's, and its errors (naming the full, prefixed key) pass through unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from ringtorch.store._table import display_key
from ringtorch.store.base import KeyLike, Store, encode_key, encode_keys


class PrefixStore(Store):
    """torch's ``PrefixStore(prefix, store)``: keys are ``prefix + "/" + key`` in ``store``."""

    def __init__(self, prefix: str, store: Store) -> None:
        if not isinstance(prefix, str):
            raise TypeError(f"PrefixStore prefix must be a str, not {type(prefix).__name__}")
        if not isinstance(store, Store):
            raise TypeError(f"PrefixStore wraps a Store, not {type(store).__name__}")
        super().__init__(store.timeout)
        self._prefix = prefix
        self._store = store
        self._head = prefix + "/"

    @property
    def underlying_store(self) -> Store:
        """The store this view writes into."""
        return self._store

    @property
    def prefix(self) -> str:
        return self._prefix

    @property
    def timeout(self) -> timedelta:
        """The underlying store's timeout (a PrefixStore has none of its own)."""
        return self._store.timeout

    def set_timeout(self, timeout: timedelta) -> None:
        """Set the underlying store's timeout."""
        self._store.set_timeout(timeout)

    def wait(self, keys: Sequence[KeyLike], timeout: timedelta | None = None) -> None:
        """See base class."""
        self._check_open()
        full = [self._full(k) for k in encode_keys(keys, "wait")]
        if timeout is None:
            self._store.wait(full)
        else:
            self._store.wait(full, timeout)

    def clone(self) -> PrefixStore:
        """A PrefixStore with the same prefix over a clone of the underlying store."""
        return PrefixStore(self._prefix, self._store.clone())

    def _full(self, key: bytes) -> str:
        return self._head + display_key(key)

    def _describe(self) -> str:
        return f"PrefixStore {self._prefix!r} over {self._store._describe()}"

    def _set(self, key: bytes, value: bytes) -> None:
        self._store.set(self._full(key), value)

    def _get(self, key: bytes, timeout: timedelta) -> bytes | None:
        return self._store.get(self._full(key))

    def _add(self, key: bytes, amount: int) -> int:
        return self._store.add(self._full(key), amount)

    def _compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        return self._store.compare_set(self._full(key), expected, desired)

    def _wait(self, keys: list[bytes], timeout: timedelta) -> bool:
        self._store.wait([self._full(k) for k in keys], timeout)
        return True

    def _check(self, keys: list[bytes]) -> bool:
        return self._store.check([self._full(k) for k in keys])

    def _delete_key(self, key: bytes) -> bool:
        return self._store.delete_key(self._full(key))

    def _num_keys(self) -> int:
        return self._store.num_keys()

    def _multi_get(self, keys: list[bytes], timeout: timedelta) -> list[bytes] | None:
        return self._store.multi_get([self._full(k) for k in keys])

    def _multi_set(self, keys: list[bytes], values: list[bytes]) -> None:
        self._store.multi_set([self._full(k) for k in keys], values)

    def _append(self, key: bytes, value: bytes) -> None:
        self._store.append(self._full(key), value)

    def _list_keys(self) -> list[bytes]:
        head = self._head
        return [encode_key(k[len(head):]) for k in self._store.list_keys() if k.startswith(head)]

    def _queue_push(self, key: bytes, value: bytes) -> None:
        self._store.queue_push(self._full(key), value)

    def _queue_pop(self, key: bytes, block: bool, timeout: timedelta) -> bytes | None:
        return self._store.queue_pop(self._full(key), block)

    def _queue_len(self, key: bytes) -> int:
        return self._store.queue_len(self._full(key))


__all__ = ["PrefixStore"]

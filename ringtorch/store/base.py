"""The Store API of torch.distributed: a key-value store shared by the ranks of a job.

``Store``'s public methods are the contract (torch's names, arguments and return types). Each
checks its arguments and the closed state once, converts keys and values to bytes and calls a
private method (``_set``, ``_get``...) that only moves bytes through its medium: a TCP server,
a file, a dict. Timeout errors are built here, so every store words them the same way:

    DistStoreError: wait for keys ['a', 'b'] timed out after 0:00:01 (store timeout, 1000ms)
    on TCPStore 127.0.0.1:29500

Values are bytes; a str value is encoded as UTF-8. Keys are str (bytes are accepted too).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from ringtorch._errors import DistStoreError, QueueEmptyError
from ringtorch.store._table import display_key

DEFAULT_TIMEOUT = timedelta(seconds=300)

KeyLike = str | bytes
ValueLike = str | bytes | bytearray | memoryview


def encode_key(key: Any) -> bytes:
    """A key as bytes (str keys are UTF-8).

    Raises:
        TypeError: key is neither str nor bytes.
    """
    if isinstance(key, str):
        return key.encode("utf-8", "surrogateescape")
    if isinstance(key, (bytes, bytearray)):
        return bytes(key)
    raise TypeError(f"store keys must be str, not {type(key).__name__} ({key!r})")


def encode_value(value: Any, what: str = "value") -> bytes:
    """A value as bytes (str values are UTF-8).

    Raises:
        TypeError: value is not str or a bytes-like object.
    """
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"store {what}s must be str or bytes, not {type(value).__name__}")


def encode_keys(keys: Any, method: str) -> list[bytes]:
    if isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence):
        raise TypeError(f"{method} takes a list of keys, not {type(keys).__name__} ({keys!r})")
    return [encode_key(k) for k in keys]


def check_timeout(timeout: Any) -> timedelta:
    if not isinstance(timeout, timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, not {type(timeout).__name__}")
    if timeout < timedelta(0):
        raise ValueError(f"timeout must not be negative, got {timeout}")
    return timeout


class Store:
    """A key-value store shared by processes; the base of every store.

    Blocking operations (``get``, ``wait``, ``multi_get``, ``queue_pop``) wait at most the
    store's timeout (``set_timeout``; ``wait`` also takes its own) and then raise
    ``DistStoreError`` naming the keys and the timeout. A zero timeout checks once.
    Stores are thread-safe.
    """

    _timeout = DEFAULT_TIMEOUT  # class defaults: a subclass may skip Store.__init__, as torch's
    _closed = False

    def __init__(self, timeout: timedelta = DEFAULT_TIMEOUT) -> None:
        self._timeout = check_timeout(timeout)
        self._closed = False

    # ----- contract -------------------------------------------------------------------

    def set(self, key: KeyLike, value: ValueLike) -> None:
        """Store ``value`` under ``key``, replacing what was there, and wake its waiters."""
        self._check_open()
        self._set(encode_key(key), encode_value(value))

    def get(self, key: KeyLike) -> bytes:
        """The value of ``key``, waiting up to the store timeout for it to be set.

        Raises:
            DistStoreError: the key was not set within the timeout.
        """
        self._check_open()
        k = encode_key(key)
        value = self._get(k, self._timeout)
        if value is None:
            raise self._timeout_error(f"get of key {display_key(k)!r}", self._timeout, "store")
        return value

    def add(self, key: KeyLike, amount: int) -> int:
        """Atomically add ``amount`` to the integer at ``key`` (0 if absent); the new value.

        Raises:
            ValueError: the key holds a value that is not an integer.
        """
        self._check_open()
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise TypeError(f"add amount must be an int, not {type(amount).__name__}")
        return self._add(encode_key(key), amount)

    def compare_set(self, key: KeyLike, expected_value: ValueLike,
                    desired_value: ValueLike) -> bytes:
        """Set ``key`` to ``desired_value`` if it holds ``expected_value`` (or is absent and
        ``expected_value`` is empty). Returns the key's value after the operation; for an
        absent key with a non-empty ``expected_value``, returns ``expected_value`` (torch's)."""
        self._check_open()
        return self._compare_set(encode_key(key), encode_value(expected_value, "expected value"),
                                 encode_value(desired_value, "desired value"))

    def wait(self, keys: Sequence[KeyLike], timeout: timedelta | None = None) -> None:
        """Wait until every key exists, up to ``timeout`` (default: the store timeout).

        Raises:
            DistStoreError: some key was still missing at the timeout; names the keys.
        """
        self._check_open()
        ks = encode_keys(keys, "wait")
        limit, source = (self._timeout, "store") if timeout is None else (
            check_timeout(timeout), "wait")
        if not self._wait(ks, limit):
            raise self._timeout_error(f"wait for keys {[display_key(k) for k in ks]}", limit,
                                      source)

    def check(self, keys: Sequence[KeyLike]) -> bool:
        """True when every key exists now; never waits."""
        self._check_open()
        return self._check(encode_keys(keys, "check"))

    def delete_key(self, key: KeyLike) -> bool:
        """Delete ``key``; True when it existed."""
        self._check_open()
        return self._delete_key(encode_key(key))

    def num_keys(self) -> int:
        """The number of keys, including the store's own bookkeeping keys (as torch counts)."""
        self._check_open()
        return self._num_keys()

    def multi_get(self, keys: Sequence[KeyLike]) -> list[bytes]:
        """The values of ``keys``, waiting up to the store timeout for all of them."""
        self._check_open()
        ks = encode_keys(keys, "multi_get")
        values = self._multi_get(ks, self._timeout)
        if values is None:
            raise self._timeout_error(f"multi_get of keys {[display_key(k) for k in ks]}",
                                      self._timeout, "store")
        return values

    def multi_set(self, keys: Sequence[KeyLike], values: Sequence[ValueLike]) -> None:
        """Set each key to its value, as one operation."""
        self._check_open()
        ks = encode_keys(keys, "multi_set")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(f"multi_set takes a list of values, not {type(values).__name__}")
        if len(ks) != len(values):
            raise ValueError(f"multi_set got {len(ks)} keys and {len(values)} values; "
                             f"they must be as many")
        self._multi_set(ks, [encode_value(v) for v in values])

    def append(self, key: KeyLike, value: ValueLike) -> None:
        """Append ``value`` to the bytes at ``key`` (create it when absent)."""
        self._check_open()
        self._append(encode_key(key), encode_value(value))

    def list_keys(self) -> list[str]:
        """Every key set by users (bookkeeping keys are hidden)."""
        self._check_open()
        return [display_key(k) for k in self._list_keys()]

    def queue_push(self, key: KeyLike, value: ValueLike) -> None:
        """Push ``value`` at the back of the queue named ``key``."""
        self._check_open()
        self._queue_push(encode_key(key), encode_value(value))

    def queue_pop(self, key: KeyLike, block: bool = True) -> bytes:
        """Pop the front of the queue ``key``; with ``block``, wait up to the store timeout.

        Raises:
            QueueEmptyError: ``block`` is False and the queue is empty.
            DistStoreError: ``block`` is True and nothing arrived within the timeout.
        """
        self._check_open()
        k = encode_key(key)
        value = self._queue_pop(k, bool(block), self._timeout)
        if value is None:
            if not block:
                raise QueueEmptyError(f"queue {display_key(k)!r} is empty on {self._describe()}")
            raise self._timeout_error(f"queue_pop of queue {display_key(k)!r}", self._timeout,
                                      "store")
        return value

    def queue_len(self, key: KeyLike) -> int:
        """The number of values in the queue ``key`` (0 when it does not exist)."""
        self._check_open()
        return self._queue_len(encode_key(key))

    @property
    def timeout(self) -> timedelta:
        """The store timeout: how long blocking operations wait."""
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        """Change the store timeout for later operations."""
        self._timeout = check_timeout(timeout)

    def has_extended_api(self) -> bool:
        """True: every ringtorch store implements append, multi_get and multi_set."""
        return True

    def clone(self) -> Store:
        """A new handle on the same store, safe to use from another thread."""
        raise NotImplementedError(f"{type(self).__name__} does not support clone()")

    def close(self) -> None:
        """Release the store's connections and files; later operations raise. Idempotent."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----- helpers for implementations ------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise DistStoreError(f"{self._describe()} is closed")

    def _timeout_error(self, what: str, timeout: timedelta, source: str) -> DistStoreError:
        ms = timeout.total_seconds() * 1000.0
        return DistStoreError(f"{what} timed out after {timeout} ({source} timeout, {ms:g}ms) "
                              f"on {self._describe()}")

    def _describe(self) -> str:
        return type(self).__name__

    def _close(self) -> None:
        """Release resources (called once by close())."""

    # ----- the medium: implementations move bytes -------------------------------------
    # Not abstract: a user's Python subclass may override the public methods instead (as
    # with torch's dist.Store); whatever it leaves out says so when called.

    def _missing(self, method: str) -> NotImplementedError:
        return NotImplementedError(f"{type(self).__name__} does not implement {method}()")

    def _set(self, key: bytes, value: bytes) -> None:
        raise self._missing("set")

    def _get(self, key: bytes, timeout: timedelta) -> bytes | None:
        """The value, or None when it was not set within ``timeout``."""
        raise self._missing("get")

    def _add(self, key: bytes, amount: int) -> int:
        raise self._missing("add")

    def _compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        raise self._missing("compare_set")

    def _wait(self, keys: list[bytes], timeout: timedelta) -> bool:
        """True once every key exists; False when ``timeout`` passed first."""
        raise self._missing("wait")

    def _check(self, keys: list[bytes]) -> bool:
        raise self._missing("check")

    def _delete_key(self, key: bytes) -> bool:
        raise self._missing("delete_key")

    def _num_keys(self) -> int:
        raise self._missing("num_keys")

    def _multi_get(self, keys: list[bytes], timeout: timedelta) -> list[bytes] | None:
        raise self._missing("multi_get")

    def _multi_set(self, keys: list[bytes], values: list[bytes]) -> None:
        raise self._missing("multi_set")

    def _append(self, key: bytes, value: bytes) -> None:
        raise self._missing("append")

    def _list_keys(self) -> list[bytes]:
        raise self._missing("list_keys")

    def _queue_push(self, key: bytes, value: bytes) -> None:
        raise self._missing("queue_push")

    def _queue_pop(self, key: bytes, block: bool, timeout: timedelta) -> bytes | None:
        """The front value; None when empty (not block) or on timeout (block)."""
        raise self._missing("queue_pop")

    def _queue_len(self, key: bytes) -> int:
        raise self._missing("queue_len")

"""The store's data and the exact semantics of each operation, written once.

The TCPStore server, HashStore and FileStore all keep their keys in a ``KeyValueTable``, so
``compare_set``'s quirks, ``add`` on a missing key and queue visibility are the same
everywhere. The table is pure: no locks, no I/O; callers serialize access.

Semantics (torch's c10d stores, checked against torch 2.13):
- keys and values are bytes; ``add`` keeps the integer as ASCII decimal bytes;
- ``compare_set(k, expected, desired)``: if k exists and equals expected, or k is absent and
  expected is empty, k becomes desired and desired is returned; if k is absent otherwise,
  expected is returned and nothing is inserted; if k holds another value, that value is returned;
- a queue lives beside the keys under the same name: ``check``/``wait`` see a non-empty queue
  as an existing key, ``delete_key`` and ``num_keys`` ignore queues;
- keys starting with INTERNAL_PREFIX are the store's own bookkeeping: ``num_keys`` counts them
  (as torch's TCPStore counts its ``init/`` key), ``list_keys`` hides them.
"""

from __future__ import annotations

from collections import deque

INTERNAL_PREFIX = b"\x00ringtorch/"


class KeyValueTable:
    """Keys, values and queues of one store."""

    __slots__ = ("data", "queues")

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.queues: dict[bytes, deque[bytes]] = {}

    def has(self, key: bytes) -> bool:
        """True when key holds a value or a non-empty queue."""
        return key in self.data or bool(self.queues.get(key))

    def has_all(self, keys: list[bytes]) -> bool:
        data = self.data
        for key in keys:
            if key not in data and not self.queues.get(key):
                return False
        return True

    def add(self, key: bytes, amount: int) -> int:
        """Add ``amount`` to the integer at key (0 when absent); return the new value.

        Raises:
            ValueError: key holds something that is not an integer.
        """
        data = self.data
        current = data.get(key)
        if current is None:
            value = amount
        else:
            try:
                value = int(current) + amount
            except ValueError:
                raise ValueError(
                    f"add: key {display_key(key)!r} holds {current[:64]!r}, not an integer"
                ) from None
        data[key] = b"%d" % value
        return value

    def compare_set(self, key: bytes, expected: bytes, desired: bytes) -> tuple[bytes, bool]:
        """torch's compare_set; returns (the value to report, whether key changed)."""
        current = self.data.get(key)
        if current is None:
            if expected == b"":
                self.data[key] = desired
                return desired, True
            return expected, False
        if current == expected:
            self.data[key] = desired
            return desired, True
        return current, False

    def append(self, key: bytes, value: bytes) -> None:
        self.data[key] = self.data.get(key, b"") + value

    def delete(self, key: bytes) -> bool:
        return self.data.pop(key, None) is not None

    def num_keys(self) -> int:
        return len(self.data)

    def list_keys(self) -> list[bytes]:
        return [k for k in self.data if not k.startswith(INTERNAL_PREFIX)]

    def queue_push(self, key: bytes, value: bytes) -> None:
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = deque()
        queue.append(value)

    def queue_pop(self, key: bytes) -> bytes | None:
        """The oldest value of the queue at key, or None when it is empty."""
        queue = self.queues.get(key)
        if not queue:
            return None
        value = queue.popleft()
        if not queue:
            del self.queues[key]
        return value

    def queue_len(self, key: bytes) -> int:
        queue = self.queues.get(key)
        return len(queue) if queue else 0


def display_key(key: bytes) -> str:
    """A key as the user wrote it (keys are UTF-8; undecodable bytes round-trip)."""
    return key.decode("utf-8", "surrogateescape")

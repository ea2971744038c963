"""FileStore: processes that share a file (on one host or a shared file system) share a store.

The file is an append-only log of records; every process replays the records it has not seen
into its own KeyValueTable, under ``flock`` (shared to read, exclusive to write), and writes
each change as one record with one ``write``. A record cut short by a crashed writer is cut
off by the next writer. Like torch, each FileStore adds itself to a reference count in the
file and the last one to close removes the file when ``world_size`` stores have finished.
Blocking ``get``/``wait`` re-read the file with a short back-off (1 ms growing to 10 ms): a
file offers no notification to wait on.

Record layout (little-endian), one after another from offset 0:

    offset 0  u8   kind: 1 set, 2 delete, 3 queue push, 4 queue pop
    offset 1  u32  key_nbytes
    offset 5  u32  value_nbytes (0 for delete and queue pop)
    offset 9  ...  key, then value
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TypeVar

from ringtorch.store._table import INTERNAL_PREFIX, KeyValueTable
from ringtorch.store.base import DEFAULT_TIMEOUT, Store

RECORD = struct.Struct("<BII")
_SET, _DELETE, _PUSH, _POP = 1, 2, 3, 4
_REFCOUNT_KEY = INTERNAL_PREFIX + b"refcount"
_FINISHED_KEY = INTERNAL_PREFIX + b"finished"
T = TypeVar("T")


class _Log:
    """The open file and this process's replay of it; released by close() or the GC."""

    def __init__(self, path: str, world_size: int) -> None:
        self.path = path
        self.world_size = world_size
        self.fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self.table = KeyValueTable()
        self.offset = 0
        self.lock = threading.Lock()

    @contextmanager
    def locked(self, exclusive: bool) -> Iterator[KeyValueTable]:
        assert self.fd is not None
        with self.lock:
            fcntl.flock(self.fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                self._replay(exclusive)
                yield self.table
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _replay(self, exclusive: bool) -> None:
        assert self.fd is not None
        size = os.fstat(self.fd).st_size
        if size <= self.offset:
            return
        data = os.pread(self.fd, size - self.offset, self.offset)
        pos, table = 0, self.table
        while pos + RECORD.size <= len(data):
            kind, key_nbytes, value_nbytes = RECORD.unpack_from(data, pos)
            end = pos + RECORD.size + key_nbytes + value_nbytes
            if end > len(data):
                break
            key = data[pos + RECORD.size:pos + RECORD.size + key_nbytes]
            value = data[end - value_nbytes:end]
            if kind == _SET:
                table.data[key] = value
            elif kind == _DELETE:
                table.data.pop(key, None)
            elif kind == _PUSH:
                table.queue_push(key, value)
            elif kind == _POP:
                table.queue_pop(key)
            pos = end
        self.offset += pos
        if exclusive and self.offset < size:  # a writer died mid-record: cut it off
            os.ftruncate(self.fd, self.offset)

    def write(self, *records: tuple[int, bytes, bytes]) -> None:
        """Append records (call inside ``locked(True)``, after changing the table)."""
        assert self.fd is not None
        parts = []
        for kind, key, value in records:
            parts += (RECORD.pack(kind, len(key), len(value)), key, value)
        data = b"".join(parts)
        os.pwrite(self.fd, data, self.offset)
        self.offset += len(data)

    def add(self, key: bytes, amount: int) -> int:
        with self.locked(True) as table:
            value = table.add(key, amount)
            self.write((_SET, key, table.data[key]))
            return value

    def release(self) -> None:
        """Leave the store; the last of ``world_size`` finished users removes the file."""
        if self.fd is None:
            return
        try:
            finished = self.add(_FINISHED_KEY, 1)
            users = self.add(_REFCOUNT_KEY, -1)
            if users == 0 and self.world_size >= 0 and finished >= self.world_size:
                try:
                    os.remove(self.path)
                except FileNotFoundError:
                    pass
        except OSError:
            pass  # the file went away under us: nothing left to release
        finally:
            os.close(self.fd)
            self.fd = None


class FileStore(Store):
    """torch's ``FileStore(file_name, world_size=-1)``."""

    def __init__(self, file_name: str, world_size: int = -1,
                 timeout: timedelta = DEFAULT_TIMEOUT) -> None:
        super().__init__(timeout)
        if not isinstance(file_name, (str, os.PathLike)) or not os.fspath(file_name):
            raise ValueError(f"FileStore needs a file name, got {file_name!r}")
        self._path = os.fspath(file_name)
        self._world_size = world_size
        try:
            self._log = _Log(self._path, world_size)
        except OSError as exc:
            raise ValueError(f"FileStore cannot open {self._path!r}: {exc.strerror}") from None
        self._finalizer = weakref.finalize(self, self._log.release)
        self._log.add(_REFCOUNT_KEY, 1)

    @property
    def path(self) -> str:
        return self._path

    def clone(self) -> FileStore:
        """A new FileStore on the same file (it counts as one more user)."""
        return FileStore(self._path, self._world_size, self._timeout)

    def _describe(self) -> str:
        return f"FileStore {self._path}"

    def _close(self) -> None:
        self._finalizer()

    def _poll(self, probe: Callable[[KeyValueTable], T | None], timeout: timedelta) -> T | None:
        deadline = time.monotonic() + timeout.total_seconds()
        delay = 0.001
        while True:
            with self._log.locked(False) as table:
                result = probe(table)
            if result is not None:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.01)

    def _set(self, key: bytes, value: bytes) -> None:
        with self._log.locked(True) as table:
            table.data[key] = value
            self._log.write((_SET, key, value))

    def _get(self, key: bytes, timeout: timedelta) -> bytes | None:
        return self._poll(lambda table: table.data.get(key), timeout)

    def _add(self, key: bytes, amount: int) -> int:
        return self._log.add(key, amount)

    def _compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        with self._log.locked(True) as table:
            result, changed = table.compare_set(key, expected, desired)
            if changed:
                self._log.write((_SET, key, desired))
            return result

    def _wait(self, keys: list[bytes], timeout: timedelta) -> bool:
        return self._poll(lambda table: table.has_all(keys) or None, timeout) is not None

    def _check(self, keys: list[bytes]) -> bool:
        with self._log.locked(False) as table:
            return table.has_all(keys)

    def _delete_key(self, key: bytes) -> bool:
        with self._log.locked(True) as table:
            existed = table.delete(key)
            if existed:
                self._log.write((_DELETE, key, b""))
            return existed

    def _num_keys(self) -> int:
        with self._log.locked(False) as table:
            return table.num_keys()

    def _multi_get(self, keys: list[bytes], timeout: timedelta) -> list[bytes] | None:
        def probe(table: KeyValueTable) -> list[bytes] | None:
            data = table.data
            return [data[k] for k in keys] if all(k in data for k in keys) else None

        return self._poll(probe, timeout)

    def _multi_set(self, keys: list[bytes], values: list[bytes]) -> None:
        with self._log.locked(True) as table:
            table.data.update(zip(keys, values, strict=True))
            self._log.write(*[(_SET, k, v) for k, v in zip(keys, values, strict=True)])

    def _append(self, key: bytes, value: bytes) -> None:
        with self._log.locked(True) as table:
            table.append(key, value)
            self._log.write((_SET, key, table.data[key]))

    def _list_keys(self) -> list[bytes]:
        with self._log.locked(False) as table:
            return table.list_keys()

    def _queue_push(self, key: bytes, value: bytes) -> None:
        with self._log.locked(True) as table:
            table.queue_push(key, value)
            self._log.write((_PUSH, key, value))

    def _queue_pop(self, key: bytes, block: bool, timeout: timedelta) -> bytes | None:
        def pop_now() -> bytes | None:
            with self._log.locked(True) as table:
                value = table.queue_pop(key)
                if value is not None:
                    self._log.write((_POP, key, b""))
                return value

        if not block:
            return pop_now()
        deadline = time.monotonic() + timeout.total_seconds()
        while True:
            if self._poll(lambda t: t.queue_len(key) or None,
                          timedelta(seconds=max(0.0, deadline - time.monotonic()))) is None:
                return None
            value = pop_now()  # another process may have taken it in between: wait again
            if value is not None:
                return value

    def _queue_len(self, key: bytes) -> int:
        with self._log.locked(False) as table:
            return table.queue_len(key)


__all__ = ["FileStore"]

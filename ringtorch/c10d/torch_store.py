"""TorchStore: torch's own store (``torch.distributed.Store``) seen as a ringtorch Store.

torch hands a backend's creator its C++ store (a PrefixStore over a TCPStore, FileStore or
HashStore); the engine rendezvouses (socket addresses, shared-memory names) through
ringtorch's Store API. This adapter only moves bytes between the two APIs: keys are str on
torch's side, a missing key within a timeout is ``None`` on ours (the base class words the
error), and every other error of torch's store passes through unchanged.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist

from ringtorch.store import Store

# torch's "wait forever" (a zero timeout means "check once" on ringtorch's side)
_NO_TIMEOUT = timedelta(0)


def _key(key: bytes) -> str:
    return key.decode("utf-8", "surrogateescape")


class TorchStore(Store):
    """A ringtorch ``Store`` over a ``torch.distributed.Store`` (``torch_store``)."""

    def __init__(self, torch_store: Any) -> None:
        super().__init__(torch_store.timeout)
        self._torch = torch_store

    @property
    def torch_store(self) -> Any:
        """The torch store this adapter writes into."""
        return self._torch

    @property
    def timeout(self) -> timedelta:
        """torch's store's timeout."""
        return self._torch.timeout

    def set_timeout(self, timeout: timedelta) -> None:
        """Set torch's store's timeout (and this one's: they are one)."""
        super().set_timeout(timeout)
        self._torch.set_timeout(timeout)

    def clone(self) -> TorchStore:
        """A TorchStore over a clone of torch's store (its own connection)."""
        return TorchStore(self._torch.clone())

    def _describe(self) -> str:
        return f"torch {type(self._torch).__name__}"

    def _set(self, key: bytes, value: bytes) -> None:
        self._torch.set(_key(key), value)

    def _get(self, key: bytes, timeout: timedelta) -> bytes | None:
        if not self._wait([key], timeout):
            return None
        return bytes(self._torch.get(_key(key)))

    def _add(self, key: bytes, amount: int) -> int:
        return int(self._torch.add(_key(key), amount))

    def _compare_set(self, key: bytes, expected: bytes, desired: bytes) -> bytes:
        return bytes(self._torch.compare_set(_key(key), expected, desired))

    def _wait(self, keys: list[bytes], timeout: timedelta) -> bool:
        names = [_key(k) for k in keys]
        if timeout <= _NO_TIMEOUT:
            return bool(self._torch.check(names))
        try:
            self._torch.wait(names, timeout)
        except dist.DistStoreError:
            return False
        return True

    def _check(self, keys: list[bytes]) -> bool:
        return bool(self._torch.check([_key(k) for k in keys]))

    def _delete_key(self, key: bytes) -> bool:
        return bool(self._torch.delete_key(_key(key)))

    def _num_keys(self) -> int:
        return int(self._torch.num_keys())

    def _multi_get(self, keys: list[bytes], timeout: timedelta) -> list[bytes] | None:
        if not self._wait(keys, timeout):
            return None
        return [bytes(v) for v in self._torch.multi_get([_key(k) for k in keys])]

    def _multi_set(self, keys: list[bytes], values: list[bytes]) -> None:
        self._torch.multi_set([_key(k) for k in keys], values)

    def _append(self, key: bytes, value: bytes) -> None:
        self._torch.append(_key(key), value)


    def _list_keys(self) -> list[bytes]:
        return [k.encode("utf-8", "surrogateescape") for k in self._torch.list_keys()]

    def _queue_push(self, key: bytes, value: bytes) -> None:
        self._torch.queue_push(_key(key), value)

    def _queue_pop(self, key: bytes, block: bool, timeout: timedelta) -> bytes | None:
        # torch's blocking pop waits its store's timeout, which is this store's
        if not block and not self._torch.queue_len(_key(key)):
            return None
        try:
            return bytes(self._torch.queue_pop(_key(key), block))
        except dist.DistError:
            return None

    def _queue_len(self, key: bytes) -> int:
        return int(self._torch.queue_len(_key(key)))


__all__ = ["TorchStore"]

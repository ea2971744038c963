"""StoreForTorch: a ringtorch Store seen as torch's ``torch.distributed.Store``.

The reverse of ``torch_store.py``. A job that initialized through ``ringtorch.distributed``
rendezvoused on ringtorch's store; torch's world records a store beside its default group
(``_world.pg_map``), and torch's ``new_group`` wraps it in its C++ ``PrefixStore``, which
takes only torch Stores. torch's Python-store trampoline lets a Python subclass stand in:
each method here only moves the call to ringtorch's store (str keys on torch's side, bytes
or str values), so no key is written twice and every error of ringtorch's store passes
through unchanged.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as dist


class StoreForTorch(dist.Store):
    """torch's Store API over the ringtorch ``store`` (its keys, its connection)."""

    def __init__(self, store: Any) -> None:
        super().__init__()
        self._store = store

    @property
    def ringtorch_store(self) -> Any:
        """The ringtorch store behind this one."""
        return self._store

    def set(self, key: str, value: Any) -> None:
        self._store.set(key, value)

    def get(self, key: str) -> bytes:
        return self._store.get(key)

    def add(self, key: str, value: int) -> int:
        return self._store.add(key, value)

    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        return self._store.compare_set(key, expected_value, desired_value)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._store.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        return self._store.check(keys)

    def delete_key(self, key: str) -> bool:
        return self._store.delete_key(key)

    def num_keys(self) -> int:
        return self._store.num_keys()

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._store.multi_get(keys)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._store.multi_set(keys, values)

    def append(self, key: str, value: Any) -> None:
        self._store.append(key, value)

    def list_keys(self) -> list[str]:
        return self._store.list_keys()


__all__ = ["StoreForTorch"]

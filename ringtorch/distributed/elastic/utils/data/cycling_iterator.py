"""CyclingIterator: one iterator over ``n`` epochs of a per-epoch iterator.

Rule kept: ``generator_fn(epoch)`` is called once per epoch, for epochs ``start_epoch`` to
``n - 1`` in order, each call only after the previous epoch's iterator is exhausted (so the
function can call a sampler's ``set_epoch`` for the epoch it builds), as torch's class does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

_T = TypeVar("_T")


class CyclingIterator(Iterator[_T]):
    """Iterate through ``generator_fn(epoch)`` for every epoch from ``start_epoch`` to ``n - 1``.

    If ``generator_fn`` always returns ``iter([1, 2, 3])``, ``CyclingIterator(2, generator_fn)``
    yields ``1, 2, 3, 1, 2, 3``. The first epoch's iterator is built at construction.
    """

    def __init__(self, n: int, generator_fn: Callable[[int], Iterator[_T]],
                 start_epoch: int = 0) -> None:
        self._n = n
        self._epoch = start_epoch
        self._generator_fn = generator_fn
        self._iter = generator_fn(self._epoch)

    def __iter__(self) -> CyclingIterator[_T]:
        return self

    def __next__(self) -> _T:
        while True:
            try:
                return next(self._iter)
            except StopIteration:
                if self._epoch >= self._n - 1:
                    raise
                # an empty epoch moves on to the next one, as torch's recursion does
                self._epoch += 1
                self._iter = self._generator_fn(self._epoch)


__all__ = ["CyclingIterator"]

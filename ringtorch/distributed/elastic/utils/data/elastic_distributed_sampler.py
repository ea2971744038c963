"""ElasticDistributedSampler: a DistributedSampler that starts at an index of the dataset.

Rule kept: for equal (len(dataset), num_replicas, rank, start_index, epoch) the indices are
torch's, bit for bit: a ``torch.randperm`` of the ``len(dataset) - start_index`` remaining
items on a generator seeded with the epoch alone (torch's elastic sampler ignores ``seed`` and
``shuffle``), shifted by ``start_index``, padded from its own start to a multiple of
``num_replicas``, and rank ``r`` takes every ``num_replicas``-th index from ``r``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import TypeVar

import torch

from ringtorch.utils.data import DistributedSampler

_T = TypeVar("_T")


class ElasticDistributedSampler(DistributedSampler[_T]):
    """Sampler that restricts data loading to this rank's share of ``dataset[start_index:]``.

    After a restart at another world size, pass the number of samples the job has consumed as
    ``start_index``: the remaining ones are shared among the new ranks. The dataset is assumed
    to keep its size.

    Args:
        dataset: a dataset with ``len()``.
        num_replicas: number of ranks; default: the world size of ringtorch's default group.
        rank: this rank; default: its rank in ringtorch's default group.
        start_index: the first index of the dataset to sample from.

    Raises:
        TypeError: ``dataset`` has no ``len()`` (the message is ``len()``'s, as in torch).
        ValueError: ``rank`` is not in ``[0, num_replicas - 1]``, or ``start_index`` is not
            below the dataset's size.
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 start_index: int = 0) -> None:
        super().__init__(dataset=dataset, num_replicas=num_replicas, rank=rank)
        if not isinstance(dataset, Sized):  # torch's check, after the base class used len()
            raise TypeError("Dataset must be an instance of collections.abc.Sized")
        if start_index >= len(dataset):
            raise ValueError(
                f"Start index {start_index} should be less than dataset size {len(dataset)}")
        self.start_index = start_index
        self.num_samples = math.ceil(float(len(dataset) - start_index) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self) -> Iterator[_T]:
        generator = torch.Generator()
        generator.manual_seed(self.epoch)
        remaining = len(self.dataset) - self.start_index
        indices = torch.randperm(remaining, generator=generator).add(self.start_index).tolist()
        # pad from the start of the permutation to a multiple of num_replicas
        indices += indices[: self.total_size - len(indices)]
        if len(indices) != self.total_size:
            raise AssertionError
        indices = indices[self.rank:self.total_size:self.num_replicas]
        if len(indices) != self.num_samples:
            raise AssertionError
        return iter(indices)

    def __len__(self) -> int:
        return self.num_samples


__all__ = ["ElasticDistributedSampler"]

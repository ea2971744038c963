"""DistributedSampler: each rank draws its own share of a dataset, the same share torch draws.

Rule kept: for equal (len(dataset), num_replicas, rank, shuffle, seed, drop_last, epoch) the
index list is identical to ``torch.utils.data.DistributedSampler``'s, bit for bit. The
permutation comes from ``torch.randperm`` on a ``torch.Generator`` seeded with
``seed + epoch``; the list is padded by wrapping around (or cut, with ``drop_last``) to a
multiple of ``num_replicas``; rank ``r`` takes every ``num_replicas``-th index from ``r``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized
from typing import TypeVar

import torch
from torch.utils.data import Sampler

_T_co = TypeVar("_T_co", covariant=True)


def _world_default(what: str) -> int:
    """Read world size or rank from ringtorch's default group, as torch reads its own."""
    from ringtorch import distributed as dist  # imported here: the sampler works without a group

    if not dist.is_available():
        raise RuntimeError("Requires distributed package to be available")
    return dist.get_world_size() if what == "world_size" else dist.get_rank()


def partition_indices(length: int, num_replicas: int, rank: int, shuffle: bool, seed: int,
                      epoch: int, drop_last: bool) -> list[int]:
    """The indices rank ``rank`` of ``num_replicas`` reads from a dataset of ``length`` items."""
    num_samples = _num_samples(length, num_replicas, drop_last)
    total_size = num_samples * num_replicas
    if shuffle:
        generator = torch.Generator()
        generator.manual_seed(seed + epoch)
        indices = torch.randperm(length, generator=generator).tolist()
    else:
        indices = list(range(length))
    if drop_last:
        indices = indices[:total_size]
    else:
        padding = total_size - len(indices)
        # wrap around, repeating the whole list when the padding is longer than the dataset
        indices += (indices * math.ceil(padding / max(len(indices), 1)))[:padding]
    return indices[rank:total_size:num_replicas]


def _num_samples(length: int, num_replicas: int, drop_last: bool) -> int:
    if drop_last and length % num_replicas != 0:
        return math.ceil((length - num_replicas) / num_replicas)
    return math.ceil(length / num_replicas)


class DistributedSampler(Sampler[_T_co]):
    """Sampler that restricts data loading to this rank's share of the dataset.

    Same signature, defaults, errors and indices as ``torch.utils.data.DistributedSampler``.
    Call :meth:`set_epoch` at the start of every epoch; otherwise every epoch sees the same
    order (as in torch).

    Args:
        dataset: a dataset with ``len()``; assumed to keep its size and order.
        num_replicas: number of ranks; default: the world size of ringtorch's default group.
        rank: this rank; default: its rank in ringtorch's default group.
        shuffle: shuffle the indices with ``seed + epoch``.
        seed: the shuffle seed; must be equal on every rank.
        drop_last: drop the tail so that every rank gets the same number of distinct
            indices, instead of padding with indices from the start.

    Raises:
        ValueError: ``rank`` is not in ``[0, num_replicas - 1]``.
    """

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        if num_replicas is None:
            num_replicas = _world_default("world_size")
        if rank is None:
            rank = _world_default("rank")
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        self.num_samples = _num_samples(len(dataset), num_replicas, drop_last)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self) -> Iterator[_T_co]:
        return iter(partition_indices(len(self.dataset), self.num_replicas, self.rank,
                                      self.shuffle, self.seed, self.epoch, self.drop_last))

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch: with ``shuffle=True`` each epoch gets its own order."""
        self.epoch = epoch

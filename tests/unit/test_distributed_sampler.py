"""DistributedSampler yields exactly torch's indices for the same arguments (torch is the oracle)."""

from __future__ import annotations

import itertools

import pytest
import torch.utils.data

from ringtorch.utils.data import DistributedSampler

CASES = list(itertools.product(
    [0, 1, 7, 10, 13],          # dataset length (shorter than, equal to, longer than the world)
    [1, 2, 3, 4, 5],            # num_replicas
    [True, False],              # shuffle
    [False, True],              # drop_last
))


def _both(length: int, num_replicas: int, rank: int, **kwargs: object):
    data = list(range(length))
    ours = DistributedSampler(data, num_replicas=num_replicas, rank=rank, **kwargs)
    theirs = torch.utils.data.DistributedSampler(data, num_replicas=num_replicas, rank=rank,
                                                 **kwargs)
    return ours, theirs


@pytest.mark.parametrize("length,num_replicas,shuffle,drop_last", CASES)
def test_indices_and_length_equal_torchs_for_every_rank(length, num_replicas, shuffle, drop_last):
    for rank in range(num_replicas):
        ours, theirs = _both(length, num_replicas, rank, shuffle=shuffle, drop_last=drop_last,
                             seed=3)
        assert list(ours) == list(theirs), f"rank {rank}"
        assert len(ours) == len(theirs) == len(list(ours))


def test_set_epoch_changes_the_order_as_torchs_does():
    ours, theirs = _both(50, 3, 1, seed=11)
    orders = []
    for epoch in range(4):
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert list(ours) == list(theirs), f"epoch {epoch}"
        orders.append(list(ours))
    assert len({tuple(o) for o in orders}) == 4


def test_without_set_epoch_every_epoch_sees_the_same_order():
    ours, _ = _both(50, 2, 0)
    assert list(ours) == list(ours)


def test_the_ranks_partition_the_padded_dataset():
    shards = [list(DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=False))
              for r in range(4)]
    assert shards == [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]


def test_drop_last_gives_disjoint_equal_shards():
    shards = [list(DistributedSampler(range(10), num_replicas=4, rank=r, drop_last=True))
              for r in range(4)]
    flat = [i for shard in shards for i in shard]
    assert all(len(s) == 2 for s in shards) and len(set(flat)) == 8


def test_works_as_a_dataloader_sampler():
    data = torch.utils.data.TensorDataset(torch.arange(12.0))
    sampler = DistributedSampler(data, num_replicas=3, rank=2, shuffle=False)
    batches = [b[0].tolist() for b in torch.utils.data.DataLoader(data, batch_size=2,
                                                                  sampler=sampler)]
    assert batches == [[2.0, 5.0], [8.0, 11.0]]


@pytest.mark.parametrize("rank", [-1, 3, 7])
def test_rank_outside_the_world_is_rejected(rank):
    with pytest.raises(ValueError, match=rf"^Invalid rank {rank}, rank should be in the interval "
                                         r"\[0, 2\]$"):
        DistributedSampler(range(10), num_replicas=3, rank=rank)

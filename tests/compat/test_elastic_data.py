"""``elastic.utils.data``: ElasticDistributedSampler and CyclingIterator give torch's indices,
epochs and errors (torch's own classes are the expected values)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
import torch.distributed.elastic.utils.data as torch_data

import ringtorch.distributed.elastic.utils.data as ring_data


def _outcome(fn: Callable[[], Any]) -> Any:
    """fn()'s value, or the type and text of what it raised (to compare torch with ours)."""
    try:
        return fn()
    except Exception as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize(("length", "replicas", "start_index"), [
    (10, 1, 0), (10, 3, 0), (10, 3, 4), (17, 5, 2), (9, 4, 8), (10, 4, 9), (1000, 7, 333),
])
@pytest.mark.parametrize("epoch", [0, 3])
def test_sampler_indices_are_torchs_for_every_rank(length: int, replicas: int,
                                                   start_index: int, epoch: int) -> None:
    dataset = list(range(length))
    for rank in range(replicas):
        ours = ring_data.ElasticDistributedSampler(dataset, replicas, rank, start_index)
        theirs = torch_data.ElasticDistributedSampler(dataset, replicas, rank, start_index)
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert len(ours) == len(theirs)
        assert _outcome(partial(list, ours)) == _outcome(partial(list, theirs)), f"rank {rank}"


def test_sampler_covers_the_dataset_from_start_index_once_per_epoch() -> None:
    dataset = list(range(23))
    drawn = [i for rank in range(3)
             for i in ring_data.ElasticDistributedSampler(dataset, 3, rank, start_index=5)]
    assert len(drawn) == 18 and set(drawn) == set(range(5, 23))


def test_sampler_order_changes_with_the_epoch_and_ignores_nothing_else() -> None:
    dataset = list(range(50))
    sampler = ring_data.ElasticDistributedSampler(dataset, 2, 0)
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) != first
    sampler.set_epoch(0)
    assert list(sampler) == first


def test_sampler_without_world_and_default_group_fails_as_torchs() -> None:
    # Without num_replicas and rank, each reads its own package's default group: none here.
    ours = _outcome(lambda: ring_data.ElasticDistributedSampler(list(range(4))))
    theirs = _outcome(lambda: torch_data.ElasticDistributedSampler(list(range(4))))
    assert ours == theirs == (ValueError, "Default process group has not been initialized, "
                              "please make sure to call init_process_group.")


@pytest.mark.parametrize(("args", "message"), [
    ((list(range(5)), 2, 0, 5), "Start index 5 should be less than dataset size 5"),
    ((list(range(5)), 2, 2, 0), "Invalid rank 2, rank should be in the interval [0, 1]"),
    ((list(range(5)), 2, -1, 0), "Invalid rank -1, rank should be in the interval [0, 1]"),
    ((iter(range(5)), 2, 0, 0), "object of type 'range_iterator' has no len()"),
])
def test_sampler_rejects_what_torch_rejects_with_its_message(args: tuple[Any, ...],
                                                             message: str) -> None:
    ours = _outcome(lambda: ring_data.ElasticDistributedSampler(*args))
    theirs = _outcome(lambda: torch_data.ElasticDistributedSampler(*args))
    assert ours == theirs
    assert ours[1] == message


def _recording(calls: list[int], data: Callable[[int], list[int]]
               ) -> Callable[[int], Iterator[int]]:
    def generator_fn(epoch: int) -> Iterator[int]:
        calls.append(epoch)
        return iter(data(epoch))
    return generator_fn


@pytest.mark.parametrize(("n", "start_epoch"), [(0, 0), (1, 0), (3, 0), (4, 2), (2, 5)])
def test_cycling_iterator_yields_and_calls_as_torchs(n: int, start_epoch: int) -> None:
    def data(epoch: int) -> list[int]:
        return [] if epoch == 1 else [10 * epoch + i for i in range(3)]

    ours_calls: list[int] = []
    theirs_calls: list[int] = []
    ours = list(ring_data.CyclingIterator(n, _recording(ours_calls, data), start_epoch))
    theirs = list(torch_data.CyclingIterator(n, _recording(theirs_calls, data), start_epoch))
    assert ours == theirs
    assert ours_calls == theirs_calls


def test_cycling_iterator_builds_each_epoch_only_after_the_previous_ends() -> None:
    calls: list[int] = []
    iterator = ring_data.CyclingIterator(3, _recording(calls, lambda epoch: [epoch]))
    assert calls == [0]
    assert next(iterator) == 0 and calls == [0]
    assert next(iterator) == 1 and calls == [0, 1]
    assert list(iterator) == [2] and calls == [0, 1, 2]


def test_cycling_sampler_epochs_unroll_as_torchs() -> None:
    """The documented pattern: generator_fn sets the sampler's epoch, then iterates it."""
    def unrolled(data: Any) -> list[int]:
        sampler = data.ElasticDistributedSampler(list(range(20)), 3, 1, start_index=2)

        def generator_fn(epoch: int) -> Iterator[int]:
            sampler.set_epoch(epoch)
            return iter(sampler)
        return list(data.CyclingIterator(4, generator_fn, start_epoch=1))

    assert unrolled(ring_data) == unrolled(torch_data)
    assert len(unrolled(ring_data)) == 3 * 6

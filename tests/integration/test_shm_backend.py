"""The shared-memory fast path on real processes: who decides to use shared memory, slots
that grow under a cap, many-chunk plans for ranks that share CPUs, two hosts of two ranks.

Every shm collective x dtype x reduction, with default and with tiny chunks, is the
conformance suite's (tests/conformance/test_backend.py). Ranks run
tests/integration/_shm_ranks.py; expected values are computed here from the ranks' inputs
(``make_input``) with torch, never with ringtorch.
"""

from __future__ import annotations

import os

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _shm_ranks as ranks

CONFIGS = {
    "shm": {},
    "chunked": {"SHM_CHUNK_BYTES": 256, "SHM_ONESHOT_BYTES": 0},
    "socket": {"SHM": False},
}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_a_group_of_one_host_uses_shared_memory_unless_it_is_turned_off(world_size):
    results = run_ranks(ranks.run_cases, world_size, args=([], CONFIGS), timeout=90)
    for rank, res in enumerate(results):
        assert res["uses_shm/shm"] is (world_size > 1), f"rank {rank}"
        assert res["uses_shm/chunked"] is (world_size > 1), f"rank {rank}"
        assert res["uses_shm/socket"] is False, f"rank {rank}"


def test_slots_grow_on_demand_up_to_the_cap():
    kib = 1024
    results = run_ranks(ranks.growth, 2, args=(256 * kib, [1 * kib, 100 * kib, 1024 * kib]))
    for rank, seen in enumerate(results):
        halves = [half for half, _size, _ok in seen]
        assert halves[0] == 64 * kib and halves[1] == 64 * kib, f"rank {rank}: {seen}"
        assert 64 * kib < halves[2] <= 126 * kib, f"rank {rank}: {seen}"  # grew, up to the cap
        assert all(size <= 256 * kib for _half, size, _ok in seen), f"rank {rank}: {seen}"
        assert all(ok for _half, _size, ok in seen), f"rank {rank}: {seen}"


def test_slots_grow_to_what_a_large_all_reduce_wants_without_a_cap():
    mib = 1024 * 1024
    results = run_ranks(ranks.growth, 2, args=(64 * mib, [4 * mib]))
    for rank, seen in enumerate(results):
        (half0, size0, _), (half1, size1, ok) = seen
        assert (half0, size0) == (64 * 1024, 4096 + 2 * 64 * 1024), f"rank {rank}"
        assert (half1, size1) == (2 * mib, 4096 + 4 * mib) and ok, f"rank {rank}: {seen}"


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_that_share_cpus_reduce_in_four_times_bigger_chunks(world_size):
    mib = 1024 * 1024
    spread = world_size <= len(os.sched_getaffinity(0))  # the ranks can have a CPU each
    chunk = 1 * mib if spread else 4 * mib  # RINGTORCH_SHM_CHUNK_BYTES is 1 MiB
    for rank, got in enumerate(run_ranks(ranks.staged_plan, world_size, args=(16 * mib,))):
        assert got[0] is spread and got[1] <= chunk and got[1] > chunk - 4096, f"rank {rank}"
        assert got[2] == -(-16 * mib // got[1]), f"rank {rank}: {got}"


def _decide(world_size: int, knobs_by_rank: list[dict]) -> list[dict]:
    results = run_ranks(ranks.decision, world_size, args=(knobs_by_rank,))
    want = sum(ranks.make_input(torch.int64, r, 1, 10) for r in range(world_size))
    for rank, res in enumerate(results):
        assert torch.equal(res["sum"], want), f"rank {rank}"
    return results


def test_ranks_on_one_host_use_shared_memory():
    for res in _decide(3, [{}, {}, {}]):
        assert (res["uses_shm"], res["reason"]) == (True, "")


def test_shm_off_on_any_rank_turns_it_off_for_the_whole_group():
    for res in _decide(3, [{}, {"SHM": False}, {}]):
        assert (res["uses_shm"], res["reason"]) == (False, "rank 1: disabled (RINGTORCH_SHM=0)")


def test_ranks_on_different_hosts_use_sockets():
    hosts = [{"HOST_ID": h, "SOCKET_ADDR": "127.0.0.1"} for h in "ab"]
    for res in _decide(2, hosts):
        assert (res["uses_shm"], res["reason"]) == (False, "the group spans 2 hosts")


def test_two_hosts_of_two_ranks_use_shared_memory_within_each_host_and_are_correct():
    # hierarchical collectives: tests/integration/test_shm_hierarchy.py
    hosts = [{"HOST_ID": h, "SOCKET_ADDR": "127.0.0.1"} for h in "aabb"]
    for res in _decide(4, hosts):
        assert (res["uses_shm"], res["reason"]) == (True, "")


def test_reduce_applies_the_roots_op_whatever_the_others_pass():
    results = run_ranks(ranks.reduce_with_the_roots_op, 3)
    assert results[0] == [3.0, 10.0]  # MAX over ranks, as the root asked

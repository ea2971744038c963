"""How the fault matrix reads an error message: the ranks and hosts its first line names,
and which new /dev/shm files belong to the job (names carrying one of its pids)."""

from __future__ import annotations

import pytest

from ringtorch.testing.fault_matrix import Cell, named_hosts, named_ranks, shm_files_of


@pytest.mark.parametrize("line, ranks", [
    ("all_reduce #10 on group '0' failed: rank 3 closed its connection to rank 0", [3, 0]),
    ("timed out after 0:00:06 (Timed out waiting 6001ms: the collective's timeout): ranks "
     "[2, 3] did not arrive (rank 2 did not answer)", [2, 3]),
    ("RPC to worker 'worker1' (rank 1) failed: ... on worker 'worker1' (rank 1)", [1]),
    ("Read error [172.20.51.2]:42639: Connection reset by peer", []),
    ("the process was killed by a signal; ranking 4 is not a rank", []),
])
def test_named_ranks_lists_each_rank_once_in_order(line: str, ranks: list[int]) -> None:
    assert named_ranks(line) == ranks


def test_named_hosts_finds_addresses_with_ports_and_host_ids() -> None:
    line = ("Read error [172.20.51.2]:42639 from netns-host-1, "
            "store 172.20.51.1:29500 and again 172.20.51.2")
    assert named_hosts(line) == ["172.20.51.2", "netns-host-1", "172.20.51.1:29500"]


def test_shm_files_are_the_jobs_when_a_number_in_their_name_is_one_of_its_pids() -> None:
    names = {"rt_4242_ab12", "rt_142420_cd", "torch_17_x", "other_segment", "rt_42_4242"}
    assert shm_files_of(names, {4242, 17}) == ["rt_4242_ab12", "rt_42_4242", "torch_17_x"]


@pytest.mark.parametrize("fault, rank, culprits", [
    ("sigkill", 0, {3}), ("sigstop", 1, {3}), ("store_death", 2, {0}),
    ("partition", 0, {2, 3}), ("partition", 3, {0, 1}),
])
def test_the_culprit_is_the_struck_rank_or_for_a_partition_the_other_host(
        fault: str, rank: int, culprits: set[int]) -> None:
    assert Cell("all_reduce", fault, (2, 2)).culprits(rank) == culprits


def test_a_cell_needs_a_known_workload_and_fault_and_a_rank_on_each_host() -> None:
    with pytest.raises(ValueError, match=r"^workload must be one of \('all_reduce', 'ddp', "
                                         r"'rpc'\), got 'broadcast'$"):
        Cell("broadcast", "sigkill", (1, 1))
    with pytest.raises(ValueError, match=r"^fault must be one of \('partition', 'sigkill', "
                                         r"'sigstop', 'store_death'\), got 'flood'$"):
        Cell("rpc", "flood", (1, 1))
    with pytest.raises(ValueError, match=r"^each host needs a rank, got layout \(2, 0\)$"):
        Cell("rpc", "sigkill", (2, 0))

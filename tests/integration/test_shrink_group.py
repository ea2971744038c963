"""shrink_group on the native backend: the survivors of dead ranks make a new group and go on.

World 4, real processes, ranks SIGKILLed (docs/recovery.md): two ranks killed at once (a
subgroup shrunk first, then the default group); a rank killed while it takes part in the shrink
(after its census post is in the store: the survivors must retry without it); shrink_on_failure
rebuilding the other groups, with DDP and ZeRO re-wrapped on the new world; a group spanning
(fake) hosts shrinking to a group spanning hosts (shared memory within, sockets between). The survivors'
all_reduce on the new group is checked against torch's sum of their inputs, and their ranks
against torch's renumbering (position among the survivors). Argument errors are torch's
messages, exactly.
"""

from __future__ import annotations

import re

import torch

from ringtorch.testing import run_ranks
from tests.integration import _shrink_ranks as ranks

REFUSED = [
    ("TypeError", "ranks_to_exclude must be a list, but got tuple. Example: [1, 3, 5] to exclude "
                  "ranks 1, 3, and 5."),
    ("ValueError", "ranks_to_exclude cannot be empty. To shrink a group, you must specify at "
                   "least one rank to exclude. Example: [failed_rank_id]"),
    ("ValueError", "Invalid shrink_flags value: 2. Must be one of: SHRINK_DEFAULT (0) or "
                   "SHRINK_ABORT (1). Use SHRINK_ABORT to abort ongoing operations before "
                   "shrinking."),
    ("ValueError", "Rank 4 at index 0 is out of bounds for group size 4. Valid ranks are in "
                   "range [0, 3]."),
    ("ValueError", "Duplicate rank 3 found in ranks_to_exclude at index 1. Each rank can only "
                   "be excluded once."),
    ("ValueError", "Cannot exclude all 4 ranks from process group. At least one rank must "
                   "remain. Excluding 4 ranks."),
    None,  # the rank's own number: per rank, below
    ("TypeError", "All elements in ranks_to_exclude must be integers. Element at index 0 is "
                  "str: 1"),
]


def test_two_killed_ranks_are_shrunk_away_and_the_survivors_all_reduce_renumbered() -> None:
    victims = [1, 3]
    results = run_ranks(ranks.two_die, 4, args=(victims,), timeout=90)
    survivors = [r for r in range(4) if r not in victims]
    expected = torch.stack([torch.full((3,), float(r + 1)) for r in survivors]).sum(0)
    for old_rank in victims:
        assert results[old_rank] == {"victim_signal": 9}
    for new_rank, old_rank in enumerate(survivors):
        got = results[old_rank]
        assert got["error"][0] == "PeerLostError", got["error"]
        assert got["rank"] == new_rank and got["size"] == len(survivors)
        assert got["is_default"] and not got["old_is_new"]
        assert got["ranks"] == survivors  # torch keeps the old global ranks in the mapping
        assert got["sum"] == expected.tolist()
        assert got["old_call"] == (
            "DistBackendError", "process group '0' was shrunk: its survivors (ranks [0, 2]) go "
            "on without ranks [1, 3]")
        want = list(REFUSED)
        want[6] = ("RuntimeError", f"Current rank {old_rank} is in the exclusion list and should "
                   f"not call shrink_group(). Only non-excluded ranks should participate in the "
                   f"shrinking operation. Excluded ranks should terminate their processes "
                   f"instead.")
        assert got["refused"] == want
        # the subgroup of ranks 0-2, shrunk without rank 1, beside the default group
        assert got["subgroup"] == {"ranks": [0, 2], "rank": new_rank, "size": 2,
                                   "sum": float(10 ** 0 + 10 ** 2), "default_kept": True}


def test_a_rank_killed_during_the_shrink_is_left_out_by_a_retry() -> None:
    results = run_ranks(ranks.dies_during_shrink, 4, timeout=90)
    assert results[2] == {"victim": 2} and results[3] == {"victim_signal": 9}
    for rank in (0, 1):
        got = results[rank]
        assert (got["rank"], got["size"]) == (rank, 2)
        assert got["sum"] == 10.0 * 1 + 10.0 * 2
        # the first attempt named rank 2 a survivor; the second, without it, made the group
        assert re.fullmatch(r"0~1\.1", got["name"]), got["name"]
        assert got["took"] < 5.0  # a known-dead rank is not waited for (the wait is 10 s)


def test_shrink_on_failure_rebuilds_subgroups_and_ddp_and_zero_go_on() -> None:
    results = run_ranks(ranks.recovers_ddp_zero_and_subgroups, 4, timeout=90)
    assert results[3] == {"victim_signal": 9}
    survivors = [0, 1, 2]
    for new_rank in survivors:  # the survivors keep their numbers: the lost rank was the last
        got = results[new_rank]
        assert got["error"][0] == "PeerLostError", got["error"]
        assert got["world"] == (new_rank, 3, (3,), new_rank, 4)
    # new_group([0, 1]) is rebuilt with both; new_group([2, 3]) with rank 2 alone
    assert results[0]["pair"] == results[1]["pair"] == (2, 1.0 + 2.0, [0, 1])
    assert results[2]["pair"] == (1, 3.0, [2])
    # the parameters agree; each gradient is the mean over the 3 survivors, computed by torch
    model = ranks._model()
    with torch.no_grad():
        for p, got in zip(model.parameters(), results[0]["params"], strict=True):
            p.copy_(got)
    per_rank = []
    for r in survivors:
        model.zero_grad()
        model(ranks._batch(r)).sum().backward()
        per_rank.append([p.grad.clone() for p in model.parameters()])
    for r in survivors:
        for i, got in enumerate(results[r]["grads"]):
            torch.testing.assert_close(got, sum(g[i] for g in per_rank) / 3,
                                       msg=f"rank {r}, parameter {i}")
        for mine, first in zip(results[r]["params"], results[0]["params"], strict=True):
            assert torch.equal(mine, first)
    # the momentum of each parameter a survivor owned moved to its new owner; the dead
    # rank's shard starts afresh
    before = {i: m for r in survivors for i, m in results[r]["before"].items()}
    after = {i: m for r in survivors for i, m in results[r]["after"].items()}
    assert len(before) < 4 and set(after) == set(before)
    assert after == before


def test_a_group_spanning_hosts_shrinks_to_a_group_spanning_hosts() -> None:
    # hosts faked per rank: a, a, b, b; rank 1 dies; the survivors (a, b, b) make a new
    # hierarchical group, shared memory on host b and sockets between the hosts
    results = run_ranks(ranks.shrinks_across_fake_hosts, 4, args=("aabb", 1), timeout=90,
                        env={"RINGTORCH_SHRINK_WAIT_S": "3"})
    assert results[1] == {"victim_signal": 9}
    for new_rank, old_rank in enumerate((0, 2, 3)):
        got = results[old_rank]
        assert got["error"][0] == "PeerLostError", got["error"]
        assert got["before"] == "2 hosts: [0, 1] shm, [2, 3] shm; leaders [0, 2] over sockets"
        assert got["rank"] == new_rank
        assert got["topology"] == "2 hosts: [0] alone, [1, 2] shm; leaders [0, 1] over sockets"
        assert got["sum"] == [1.0 + 3.0 + 4.0] * 3

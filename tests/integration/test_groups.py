"""Process groups: new_group and its helpers, members and non-members, names, threads, re-init.

Each scenario runs in one world (tests/integration/_groups_ranks.py); the expected values
here are computed from the ranks' inputs by hand-written arithmetic.
"""

from __future__ import annotations

import functools

import pytest

from ringtorch.testing import run_ranks
from tests.integration import _groups_ranks as G

WORLDS = [1, 2, 3, 4]


@functools.cache
def subgroups(ws: int) -> list[dict]:
    return run_ranks(G.subgroups, ws, timeout=60)


def _members(label: str, ws: int) -> list[int]:
    return {"evens": [r for r in range(ws) if r % 2 == 0],
            "odds": [r for r in range(ws) if r % 2 == 1],
            "first": list(range(1, ws))}[label]


def _warning(op: str, rank: int) -> list[str]:
    return [f"Running {op} on global rank {rank} which does not belong to the given group."]


@pytest.mark.parametrize("ws", WORLDS)
def test_group_names_count_up_from_the_default_group(ws: int) -> None:
    for res in subgroups(ws):
        assert res["default_name"] == "0"
        assert res["pg_count"] == 4
        for label, name in (("evens", "1"), ("odds", "2"), ("first", "3")):
            if res[f"{label}/info"]["member"]:
                assert res[f"{label}/info"]["name"] == name


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("label", ["evens", "odds", "first"])
def test_members_see_group_ranks_and_non_members_see_minus_one(ws: int, label: str) -> None:
    members = _members(label, ws)
    for rank, res in enumerate(subgroups(ws)):
        info = res[f"{label}/info"]
        if rank in members:
            assert info == {"member": True, "rank": members.index(rank), "size": len(members),
                            "name": info["name"], "ranks": members, "backend": "gloo",
                            "pg_rank": members.index(rank), "pg_size": len(members)}
        else:
            assert info == {"member": False, "rank": -1, "size": -1}


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("label", ["evens", "odds", "first"])
def test_all_reduce_on_a_subgroup_sums_its_members_and_skips_the_others(ws: int,
                                                                        label: str) -> None:
    members = _members(label, ws)
    total = float(sum(r + 1 for r in members))
    for rank, res in enumerate(subgroups(ws)):
        (result, warned), values = res[f"{label}/all_reduce"]
        assert result is None
        if rank in members:
            assert (warned, values) == ([], [total] * 3)
        else:
            assert (warned, values) == (_warning("all_reduce", rank), [float(rank + 1)] * 3)


@pytest.mark.parametrize("ws", WORLDS)
@pytest.mark.parametrize("label", ["evens", "odds", "first"])
def test_broadcast_src_is_global_and_group_src_is_a_group_rank(ws: int, label: str) -> None:
    members = _members(label, ws)
    if not members:
        return
    for rank, res in enumerate(subgroups(ws)):
        (r1, w1), by_src = res[f"{label}/broadcast_src"]
        (r2, w2), by_group_src = res[f"{label}/broadcast_group_src"]
        if rank in members:
            assert (r1, w1, by_src) == (None, [], [float(max(members))] * 2)
            assert (r2, w2, by_group_src) == (None, [], [float(members[0])] * 2)
        else:
            assert (w1, by_src) == (_warning("broadcast", rank), [float(rank)] * 2)
            assert (w2, by_group_src) == (_warning("broadcast", rank), [float(rank)] * 2)


@pytest.mark.parametrize("ws", WORLDS)
def test_giving_both_or_neither_of_src_and_group_src_is_rejected(ws: int) -> None:
    for res in subgroups(ws):
        assert res["both_src"][0] == ("ValueError", "Can't specify both group_rank and global_rank")
        assert res["no_src"][0] == ("ValueError", "Must specify global_rank or group_rank")


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_rank_translation_reduce_gather_and_p2p_on_a_subgroup(ws: int) -> None:
    for rank, res in enumerate(subgroups(ws)):
        (group_rank, _), (global_rank, _) = res["translate"]
        (reduced, warned), value = res["reduce_group_dst"]
        (gathered, _), parts = res["gather_dst"]
        if rank == 0:
            assert group_rank == ("ValueError", "Group -100 is not registered, please create "
                                  "group with torch.distributed.new_group API")
            assert warned == _warning("reduce", 0) and value == [0.0]
            continue
        assert (group_rank, global_rank) == (rank - 1, 1)
        if rank == 1:
            assert value == [float(sum(10 * r for r in range(1, ws)))]
        if rank == ws - 1:
            assert parts == [float(r) for r in range(1, ws)]
    if ws >= 3:
        results = subgroups(ws)
        assert results[ws - 1]["p2p"] == (None, [])
        assert results[1]["p2p"] == ((ws - 1, []), 42.0)
        assert results[0]["p2p"] == (-1, _warning("irecv", 0))


@pytest.mark.parametrize("ws", WORLDS)
def test_every_collective_on_a_subgroup_and_from_outside_it(ws: int) -> None:
    members = list(range(1, ws))
    for rank, res in enumerate(subgroups(ws)):
        ops = res["every_op"]
        if rank == 0:
            for op, got in ops.items():
                result = got[0] if isinstance(got[0], tuple) else got
                assert result == (None, _warning(op, 0)), op
            continue
        me = rank - 1
        assert ops["all_gather"] == ((None, []), [float(r) for r in members])
        assert ops["all_gather_single"] == ((None, []), [float(r) for r in members])
        if rank == ws - 1:
            assert ops["gather"] == ((None, []), [float(r) for r in members])
        assert ops["scatter"] == ((None, []), 10.0 + me)
        assert ops["reduce_scatter"] == ((None, []), float(sum(r * 100 + me for r in members)))
        assert ops["all_to_all_single"] == ((None, []), [float(me + 10 * r) for r in members])
        assert ops["barrier"] == (None, [])
        assert ops["monitored_barrier"] == (None, [])
        assert ops["broadcast_object_list"] == ((None, []), f"from {ws - 1}")


def test_subgroup_helpers_split_the_world_and_refuse_bad_sizes() -> None:
    results = run_ranks(G.subgroup_helpers, 4, timeout=60)
    for rank, res in enumerate(results):
        pair = [0, 1] if rank < 2 else [2, 3]
        assert res["pairs"] == (float(sum(pair)), 2, pair)
        enumerated = [0, 3] if rank in (0, 3) else [1, 2]
        assert res["enumerated"] == (3.0, enumerated)
        assert res["split"] == ((3.0, [0, 1, 2]) if rank < 3 else (1.0, [3]))
        assert res["errors"] == [
            ("ValueError", "The world size (4) must be divisible by 'group_size=3'"),
            ("ValueError", "The arg 'group_size' (0) must be positive"),
            ("ValueError", "The arg 'group_size' (8) must not exceed the world size (4)"),
            ("ValueError", "Default group size only takes effect when CUDA is available.If "
                           "your subgroup using a backend that does not depend on CUDA,please "
                           "pass in 'group_size' correctly."),
            ("ValueError", "The arg 'ranks_per_subgroup_list' cannot be empty"),
        ]
        assert res["overlap"] == ("ValueError",
                                  "Rank 1 has appeared in both subgroup [0, 1] and [1, 2]")


def test_overlapping_groups_from_two_threads_then_destroy_and_reinit() -> None:
    results = run_ranks(G.threads_and_lifecycle, 4, timeout=90)
    for rank, res in enumerate(results):
        left = [300.0 + 3 * i for i in range(30)] if rank in (0, 1, 2) else []
        right = [600.0 + 3 * i for i in range(30)] if rank in (1, 2, 3) else []
        assert res["threads"] == {"left": left, "right": right}
        if rank in (0, 1, 2):
            kind, message = res["after_subgroup_destroy"]
            assert kind == "DistBackendError" and "'1' has been destroyed" in message
            assert res["destroy_twice"] == ("ValueError", "Invalid process group specified")
        assert res["after_destroy"] == (
            False, ("ValueError", "Default process group has not been initialized, please "
                                  "make sure to call init_process_group."), 0)
        assert res["destroy_uninitialized"] == ("AssertionError", "Process group cannot be None")
        assert res["reinit"] == ("0", "1" if rank < 2 else None, [4.0, 4.0], 2)


def test_every_operation_on_a_non_member_warns_and_does_nothing() -> None:
    res = run_ranks(G.non_members, 2, timeout=60)[1]
    assert res["group"] == -100
    warned = {"all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter",
              "reduce_scatter", "all_to_all", "all_to_all_single", "barrier",
              "monitored_barrier", "isend", "irecv", "all_gather_object",
              "broadcast_object_list"}
    for op in warned:
        assert res[op] == (None, _warning(op, 1)), op
    assert res["recv"] == (-1, _warning("irecv", 1))
    assert res["get_rank"] == (-1, [])
    assert res["get_world_size"] == (-1, [])
    assert res["get_backend"] == (("ValueError", "Invalid process group specified"), [])
    assert res["destroy"] == (None, [])
    assert res["tensor_untouched"] == [1.0, 1.0]

"""Point-to-point: send/recv, any-source receives, tags, ordering, batches, self-sends, errors.

One world per size runs every pattern (tests/integration/_p2p_ranks.py); the expected
values are written out here from the ranks' inputs.
"""

from __future__ import annotations

import functools

import pytest

from ringtorch.testing import run_ranks
from tests.integration import _p2p_ranks as P

WORLDS = [1, 2, 3, 4]


@functools.cache
def results(ws: int) -> list[dict]:
    return run_ranks(P.patterns, ws, timeout=90)


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_blocking_ring_returns_each_sender_and_its_data(ws: int) -> None:
    for rank, res in enumerate(results(ws)):
        left = (rank - 1) % ws
        assert res["ring_src"] == left
        assert res["ring"] == [float(left)] * 3


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_two_ranks_sending_large_messages_to_each_other_first_do_not_deadlock(ws: int) -> None:
    for rank, res in enumerate(results(ws)):
        if rank ^ 1 < ws:
            assert res["big"] == (float(rank ^ 1), float(rank ^ 1))


@pytest.mark.parametrize("ws", WORLDS)
def test_recv_without_src_takes_any_sender_and_returns_its_global_rank(ws: int) -> None:
    assert results(ws)[0]["any_source"] == [(r, float(r * 11)) for r in range(1, ws)]


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_tags_match_sends_to_receives_in_any_order(ws: int) -> None:
    assert results(ws)[0]["tags"] == ([7.0, 7.0], [5.0, 5.0])


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_messages_with_one_tag_arrive_in_order_and_futures_hold_them(ws: int) -> None:
    assert results(ws)[0]["order"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert results(ws)[0]["order_futures"] == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("ws", WORLDS)
def test_batch_isend_irecv_with_receives_listed_first_completes(ws: int) -> None:
    for rank, res in enumerate(results(ws)):
        left = (rank - 1) % ws
        assert res["batch"] == [left, left * left]
        right = (rank + 1) % ws
        assert res["p2pop_repr"] == (f"P2POp(isend pg=0, group_src={rank}, "
                                     f"group_dst={right},  (2,), torch.int64)")


@pytest.mark.parametrize("ws", WORLDS)
def test_isend_to_oneself_is_received_by_irecv_from_oneself(ws: int) -> None:
    for rank, res in enumerate(results(ws)):
        assert res["self"] == [float(rank), float(rank + 1), float(rank + 2)]


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_complex_tensors_numpy_arrays_and_work_source_rank(ws: int) -> None:
    res = results(ws)
    assert res[1]["complex"] == [1 + 2j, 3 - 4j]
    assert res[1]["numpy"] == [0, 1, 2, 3]
    assert res[0]["work_source_rank"] == (ws - 1, ws - 1)


@pytest.mark.parametrize("ws", WORLDS)
def test_bad_point_to_point_calls_raise_before_sending(ws: int) -> None:
    self_msg = ("ValueError", "Invalid destination rank: destination rank should not be the "
                              "same as the rank of the current process.")
    for errors in (res["errors"] for res in results(ws)):
        assert errors["send_self"] == self_msg
        assert errors["send_out_of_range"] == (
            "ValueError", f"Invalid destination rank: {ws} is not a rank of this group (valid "
                          f"group ranks are 0 to {ws - 1})")
        assert errors["isend_out_of_range"] == (
            "ValueError", f"Invalid destination rank: -1 is not a rank of this group (valid "
                          f"group ranks are 0 to {ws - 1})")
        if ws > 1:
            assert errors["recv_strided"] == ("RuntimeError", "input tensor has to be contiguous")
            assert errors["send_strided"] == ("RuntimeError", "input tensor has to be contiguous")
        else:
            assert errors["send_strided"] == self_msg
        assert errors["negative_tag"] == (
            "ValueError", "ProcessGroup::send: tag must be >= 0, got -3 (negative tags are "
                          "reserved for ringtorch's own messages)")
        if ws > 1:
            assert errors["not_a_tensor"][0] == "TypeError"
            assert "Expected parameter `tensor` of type torch.Tensor" in errors["not_a_tensor"][1]
        else:  # torch checks "not to oneself" before the tensor
            assert errors["not_a_tensor"] == self_msg
        assert errors["bad_op"] == (
            "ValueError", "Invalid ``op``. Expected ``op`` to be of type "
                          "``torch.distributed.isend`` or ``torch.distributed.irecv``.")
        assert errors["bad_list"] == (
            "ValueError", "Invalid ``p2p_op_list``. Each op is expected to to be of type "
                          "``torch.distributed.P2POp``.")
        assert errors["both_peers"] == ("ValueError",
                                        "Can't specify both group_rank and global_rank")

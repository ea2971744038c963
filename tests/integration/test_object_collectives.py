"""Object collectives: torch's in-place semantics, tensors and arrays carried out of band.

Every rank's object is a pure function of its rank (_objects_ranks.payload), so the test
rebuilds what each rank must have received and compares it field by field.
"""

from __future__ import annotations

import functools
import pickle
from typing import Any

import numpy as np
import pytest
import torch

from ringtorch.distributed import object_ops
from ringtorch.testing import run_ranks
from tests.integration import _objects_ranks as O

WORLDS = [1, 2, 3, 4]


@functools.cache
def results(ws: int) -> list[dict]:
    return run_ranks(O.objects, ws, timeout=90)


def assert_same(got: Any, want: Any, where: str = "") -> None:
    assert type(got) is type(want), f"{where}: {type(got)} != {type(want)}"
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, where
        assert torch.equal(got.detach(), want.detach()), where
        assert got.requires_grad == want.requires_grad, where
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and np.array_equal(got, want), where
    elif isinstance(want, dict):
        assert got.keys() == want.keys(), where
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


@pytest.mark.parametrize("ws", WORLDS)
def test_all_gather_object_fills_one_entry_per_rank_and_leaves_the_rest(ws: int) -> None:
    for rank, res in enumerate(results(ws)):
        got = res["all_gather_object"]
        assert_same(got[:ws], [O.payload(r) for r in range(ws)], f"rank {rank}")
        assert got[ws] is None


@pytest.mark.parametrize("ws", WORLDS)
def test_gather_object_fills_the_list_on_dst_only(ws: int) -> None:
    for rank, res in enumerate(results(ws)):
        if rank == ws - 1:
            assert_same(res["gather_object"], [O.payload(r) for r in range(ws)])
        else:
            assert res["gather_object"] is None


@pytest.mark.parametrize("ws", WORLDS)
def test_broadcast_object_list_replaces_entries_in_place_except_on_src(ws: int) -> None:
    for rank, res in enumerate(results(ws)):
        assert_same(res["broadcast_object_list"], [O.payload(ws - 1), "tail", ws - 1])
        assert res["broadcast_src_untouched"] == (rank == ws - 1)


@pytest.mark.parametrize("ws", WORLDS)
def test_scatter_object_list_sets_element_zero(ws: int) -> None:
    for rank, res in enumerate(results(ws)):
        assert_same(res["scatter_object_list"], [O.payload(rank), "second entry stays"])


@pytest.mark.parametrize("ws", [2, 3, 4])
def test_recv_object_list_from_any_source_returns_the_sender(ws: int) -> None:
    res = results(ws)[1]
    assert res["recv_from"] == 0
    assert_same(res["recv_object_list"], [O.payload(0), {"to": 1}])


@pytest.mark.parametrize("ws", [3, 4])
def test_object_collectives_on_a_subgroup(ws: int) -> None:
    for rank, res in enumerate(results(ws)):
        if rank >= ws - 2:
            assert res["subgroup"] == [ws - 2, ws - 1]
        else:
            assert res["subgroup"] == [None, None]


@pytest.mark.parametrize("ws", WORLDS)
def test_bad_object_collective_arguments_raise_before_sending(ws: int) -> None:
    for rank, res in enumerate(results(ws)):
        errors = res["errors"]
        if ws > 1:
            assert errors["short_list"] == (
                "IndexError", f"all_gather_object: object_list has {ws - 1} entries but the "
                              f"group has {ws} ranks: pass a list of at least {ws} entries")
        if rank != ws - 1:
            assert errors["gather_list_on_non_dst"] == (
                "ValueError", "Argument ``gather_list`` must NOT be specified on "
                              "non-destination ranks.")
        assert errors["scatter_empty_output"] == (
            "ValueError", "Expected argument scatter_object_output_list to be a list of size "
                          "at least 1.")
        assert errors["scatter_no_input"] == (
            "ValueError", "source rank must provide non-None scatter_object_input_list")


def test_tensor_and_array_bytes_travel_out_of_band_not_in_the_pickle_stream() -> None:
    obj = {"t": torch.ones(1 << 16), "a": np.zeros(1 << 14), "s": "small"}
    frame = object_ops.encode(obj)
    head_count, _, pickle_nbytes = object_ops._HEAD.unpack_from(frame.numpy(), 0)
    assert head_count == 2
    assert pickle_nbytes < 1024  # the 384 KiB of data is in the buffers, not the stream
    assert frame.numel() < (1 << 18) + (1 << 17) + 2048
    assert_same(object_ops.decode(frame), obj)
    in_band = len(pickle.dumps(obj, protocol=5))
    assert in_band > (1 << 18)  # plain pickle carries the bytes in the stream

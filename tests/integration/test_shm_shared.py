"""Tensors allocated in the group's shared memory (ProcessGroup.shared_tensor): they live
in /dev/shm mappings whose names are gone once allocated, start zero-filled, and all_reduce
(through algorithms/shm/shared.py, no copy in) to the same bits as ordinary tensors do, left to right in
rank order; without shared memory they are ordinary tensors; a rank passing an ordinary
tensor where the others pass their shared one is a mismatch."""

from __future__ import annotations

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _shm_ranks as ranks


def _expected(k: int, it: int, ws: int) -> torch.Tensor:
    n, dtype, op = ranks.SHARED_SPECS[k]
    inputs = [ranks.random_input(dtype, r, 10 * k + it, n) for r in range(ws)]
    if op == "MAX":
        return torch.stack(inputs).max(dim=0).values
    scale = ranks.PREMUL_FACTOR if op == "PREMUL_SUM" else 1.0
    total = inputs[0].double() * scale
    for x in inputs[1:]:
        total = total + x.double() * scale
    return total / ws if op == "AVG" else total


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_shared_tensors_live_in_shared_memory_and_all_reduce_like_ordinary_ones(world_size):
    results = run_ranks(ranks.shared_tensors, world_size, args=(True,), timeout=120)
    first = results[0]
    for rank, got in enumerate(results):
        assert all(f.startswith("/dev/shm/ringtorch_") for f in got["files"]), got["files"]
        assert got["zeros"] == [True] * len(ranks.SHARED_SPECS)
        assert got["names_left"] == [], f"rank {rank}: names not unlinked: {got['names_left']}"
        assert got["shapes"] == [((n,), dtype) for n, dtype, _ in ranks.SHARED_SPECS]
        for k, (_n, dtype, _op) in enumerate(ranks.SHARED_SPECS):
            for it in range(2):
                shared, private = got[f"shared/{k}/{it}"], got[f"private/{k}/{it}"]
                # the same bits as the copy-in path, and as every other rank
                assert torch.equal(shared, private), f"rank {rank} tensor {k} call {it}"
                assert torch.equal(shared, first[f"shared/{k}/{it}"]), f"rank {rank} {k} {it}"
                want = _expected(k, it, world_size)
                tol = 2e-2 if dtype is torch.bfloat16 else 1e-5
                torch.testing.assert_close(shared.double(), want, rtol=tol, atol=tol)
    # float32 SUM is exactly the left-to-right sum in float32
    inputs = [ranks.random_input(torch.float32, r, 0, 1000) for r in range(world_size)]
    left_to_right = inputs[0].clone()
    for x in inputs[1:]:
        left_to_right += x
    assert torch.equal(first["shared/0/0"], left_to_right)


def test_without_shared_memory_a_shared_tensor_is_an_ordinary_one():
    results = run_ranks(ranks.shared_tensors, 2, args=(False,), timeout=120)
    for got in results:
        assert not any(f.startswith("/dev/shm/") for f in got["files"]), got["files"]
        assert got["zeros"] == [True] * len(ranks.SHARED_SPECS)
        for k in range(len(ranks.SHARED_SPECS)):
            torch.testing.assert_close(got[f"shared/{k}/1"].double(), _expected(k, 1, 2),
                                       rtol=2e-2, atol=2e-2)


def test_an_ordinary_tensor_against_the_others_shared_one_is_a_mismatch():
    results = run_ranks(ranks.shared_mismatch, 3, timeout=120)
    for rank, (kind, message) in enumerate(results):
        assert kind in ("DistBackendError", "ShmPeerError"), (rank, kind, message)
        assert "mismatch" in message, (rank, message)
    theirs = [m for _k, m in results if "collective mismatch" in m]
    assert theirs and any("shared tensor #0" in m for m in theirs), theirs


@pytest.mark.parametrize("shm", [True, False])
def test_a_group_declares_whether_its_shared_tensors_live_in_shared_memory(shm):
    results = run_ranks(ranks.group_shared_tensor, 2, args=(shm,), timeout=120)
    want = torch.arange(1000, dtype=torch.float32) * 3
    for got in results:
        assert got["shares"] is shm
        assert got["file"].startswith("/dev/shm/ringtorch_") is shm, got["file"]
        assert got["zeros"]
        assert torch.equal(got["sum"], want)

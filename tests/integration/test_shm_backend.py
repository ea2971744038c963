"""The shared-memory fast path on real processes: every shm collective x world sizes 1-4 x
dtypes x reductions, the same results as the socket path (RINGTORCH_SHM=0), many-chunk plans,
growth under a cap, and who decides to use shared memory.

Ranks run tests/integration/_shm_ranks.py; expected values are computed here from the ranks'
inputs (``make_input``) with torch, wide (float64/int64), never with ringtorch. One world per
world size runs every case on three backends (default shm, shm with tiny chunks, sockets).
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _shm_ranks as ranks

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool]
OPS_FOR = {
    **{d: ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM"] for d in FLOATS},
    **{d: ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"] for d in INTS},
    torch.complex64: ["SUM", "AVG", "PREMUL_SUM"],
}
N = 300  # elements per rank: many chunks with the tiny-chunk config
CONFIGS = {
    "shm": {},
    "chunked": {"SHM_CHUNK_BYTES": 256, "SHM_ONESHOT_BYTES": 0},
    "socket": {"SHM": False},
}


def _wide(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_complex:
        return t.to(torch.complex128)
    if t.dtype.is_floating_point:
        return t.to(torch.float64)
    return t.to(torch.int64)


def expected_reduce(inputs: list[torch.Tensor], op: str) -> torch.Tensor:
    """The reduction over ranks of ``inputs``, computed wide, in the inputs' dtype."""
    dtype = inputs[0].dtype
    if dtype is torch.bool:
        stack = torch.stack(inputs)
        if op == "BXOR":
            return stack.sum(0) % 2 == 1
        fold = {"SUM": torch.any, "MAX": torch.any, "BOR": torch.any, "PRODUCT": torch.all,
                "MIN": torch.all, "BAND": torch.all}[op]
        return fold(stack, dim=0)
    wide = [_wide(t) for t in inputs]
    if op in ("BAND", "BOR", "BXOR"):
        fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
        return functools.reduce(fn, wide).to(dtype)
    stack = torch.stack(wide)
    result = {"SUM": lambda: stack.sum(0), "AVG": lambda: stack.sum(0) / len(inputs),
              "PREMUL_SUM": lambda: stack.sum(0) * ranks.PREMUL_FACTOR,
              "PRODUCT": lambda: stack.prod(0), "MIN": lambda: stack.amin(0),
              "MAX": lambda: stack.amax(0)}[op]()
    return result.to(dtype)


def rank_order_sum(inputs: list[torch.Tensor]) -> torch.Tensor:
    """x0 + x1 + ... + x_{p-1}, left to right, in the inputs' own dtype (every rounding kept)."""
    acc = inputs[0].clone()
    for t in inputs[1:]:
        acc = acc + t
    return acc


def _cases(ws: int) -> list[dict]:
    cases = []
    for dtype, ops in OPS_FOR.items():
        for op in ops:
            for coll in ("all_reduce", "reduce", "reduce_scatter"):
                cases.append({"key": f"{coll}-{dtype}-{op}", "op": coll, "dtype": dtype, "n": N,
                              "salt": len(cases), "redop": op, "root": ws - 1})
        for coll, root in (("broadcast", 0), ("broadcast", ws - 1), ("all_gather", 0),
                           ("gather", 0), ("gather", ws - 1), ("scatter", 0),
                           ("scatter", ws - 1)):
            cases.append({"key": f"{coll}{root}-{dtype}", "op": coll, "dtype": dtype, "n": N,
                          "salt": len(cases), "root": root})
    for coll in ("all_reduce", "reduce", "reduce_scatter", "broadcast", "all_gather", "gather",
                 "scatter"):
        cases.append({"key": f"{coll}-empty", "op": coll, "dtype": torch.float32, "n": 0,
                      "salt": 0, "redop": "SUM", "root": 0})
        cases.append({"key": f"{coll}-random", "op": coll, "dtype": torch.float32, "n": 5000,
                      "salt": len(cases), "redop": "SUM", "root": ws - 1, "random": True})
    cases.append({"key": "barrier", "op": "barrier", "dtype": torch.float32, "n": 0, "salt": 0})
    for i, case in enumerate(cases):
        case["key"] = f"{i}:{case['key']}"
    return cases


def _expected(case: dict, ws: int, rank: int) -> torch.Tensor | None:
    op, dtype, n, salt = case["op"], case["dtype"], case["n"], case["salt"]
    make = ranks.random_input if case.get("random") else ranks.make_input
    per = n * ws if op in ("reduce_scatter", "scatter") else n
    inputs = [make(dtype, r, salt, per) for r in range(ws)]
    if op == "barrier" or (op in ("reduce", "gather") and rank != case["root"]):
        return None
    if op == "broadcast":
        return inputs[case["root"]]
    if op in ("all_gather", "gather"):
        return torch.cat(inputs)
    if op == "scatter":
        return inputs[case["root"]][rank * n:(rank + 1) * n]
    total = rank_order_sum(inputs) if case.get("random") else expected_reduce(inputs, case["redop"])
    return total[rank * n:(rank + 1) * n] if op == "reduce_scatter" else total


def _check(got: torch.Tensor | None, want: torch.Tensor | None, what: str, op: str) -> None:
    if want is None:
        assert got is None, what
        return
    assert got.dtype == want.dtype, what
    if op == "AVG" and want.dtype in (torch.float16, torch.bfloat16):
        torch.testing.assert_close(got, want, msg=what)  # one rounding of the division
    else:
        assert torch.equal(got, want), f"{what}: got {got[:8]} want {want[:8]}"


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_shm_collective_matches_torch_and_the_socket_path(world_size):
    cases = _cases(world_size)
    results = run_ranks(ranks.run_cases, world_size, args=(cases, CONFIGS), timeout=90)
    for rank, res in enumerate(results):
        assert res["uses_shm/shm"] is (world_size > 1), f"rank {rank}"
        assert res["uses_shm/chunked"] is (world_size > 1), f"rank {rank}"
        assert res["uses_shm/socket"] is False, f"rank {rank}"
        for case in cases:
            want = _expected(case, world_size, rank)
            for cname in ("shm", "chunked"):
                what = f"{cname} {case['key']} world {world_size} rank {rank}"
                _check(res[f"{cname}/{case['key']}"], want, what, case.get("redop", ""))
            if not case.get("random"):
                # the socket path reduces in another order: compare only exact cases bitwise
                sock, shm = res[f"socket/{case['key']}"], res[f"shm/{case['key']}"]
                assert (sock is None and shm is None) or torch.equal(sock, shm), case["key"]


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

"""NativeBackend on real processes and sockets: every op, every algorithm, every dtype, world
sizes 1-4, and the failures: mismatched collectives, a rank killed mid all_reduce, timeouts.

Ranks run tests/integration/_native_ranks.py; every expected value is computed here from the
ranks' inputs (``make_input``) with torch, in float64/int64, never with ringtorch. One world
per test runs many cases, because on 2 cores process start-up is the budget.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _native_ranks as ranks

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
OPS_FOR = {
    **{d: ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "PREMUL_SUM"] for d in FLOATS},
    **{d: ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"] for d in [*INTS, torch.bool]},
    torch.complex64: ["SUM", "AVG", "PREMUL_SUM"],
}
RING_ALL = "all_reduce=ring,broadcast=chain,reduce=ring,all_gather=ring,reduce_scatter=ring"
FORCED = {
    "default": "",
    "ring": RING_ALL + ",segment=24",  # tiny segments: many chunks even for small tensors
    "rd": "all_reduce=recursive_doubling",
    "direct": "all_reduce=direct",
    "sg": "all_reduce=scatter_gather,segment=24",
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
        fold = {"SUM": torch.any, "MAX": torch.any, "BOR": torch.any, "PRODUCT": torch.all,
                "MIN": torch.all, "BAND": torch.all}
        if op == "BXOR":
            return stack.sum(0) % 2 == 1
        return fold[op](stack, dim=0)
    wide = [_wide(t) for t in inputs]
    if op in ("BAND", "BOR", "BXOR"):
        fn = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op]
        result = functools.reduce(fn, wide)
    else:
        stack = torch.stack(wide)
        result = {"SUM": lambda: stack.sum(0), "AVG": lambda: stack.sum(0) / len(inputs),
                  "PREMUL_SUM": lambda: stack.sum(0) * ranks.PREMUL_FACTOR,
                  "PRODUCT": lambda: stack.prod(0), "MIN": lambda: stack.amin(0),
                  "MAX": lambda: stack.amax(0)}[op]()
    return result.to(dtype)


def _assert_same(got: torch.Tensor, want: torch.Tensor, what: str, op: str = "") -> None:
    assert got.dtype == want.dtype, what
    if op == "AVG" and want.dtype in (torch.float16, torch.bfloat16):
        torch.testing.assert_close(got, want, msg=what)  # one rounding of the division
    else:
        assert torch.equal(got, want), f"{what}: got {got} want {want}"


def _inputs(dtype: torch.dtype, ws: int, salt: int, n: int) -> list[torch.Tensor]:
    return [ranks.make_input(dtype, r, salt, n) for r in range(ws)]


def _reduction_cases(ws: int) -> list[dict]:
    cases = []
    for dtype, ops in OPS_FOR.items():
        for op in ops:
            cases.append({"key": f"ar-{dtype}-{op}", "op": "all_reduce", "dtype": dtype, "n": 7,
                          "salt": 1, "redop": op})
    for name, algos in FORCED.items():
        for n in (0, 1, 5, 1000):
            for dtype in (torch.float32, torch.int8):
                cases.append({"key": f"alg-{name}-{n}-{dtype}", "op": "all_reduce",
                              "dtype": dtype, "n": n, "salt": 2, "redop": "SUM",
                              "algorithms": algos})
            base = {"dtype": torch.int64, "n": n, "salt": 3, "algorithms": algos}
            for root in {0, ws - 1}:
                cases.append({**base, "key": f"red-{name}-{n}-{root}", "op": "reduce",
                              "redop": "MAX", "root": root})
                cases.append({**base, "key": f"bc-{name}-{n}-{root}", "op": "broadcast",
                              "root": root})
            cases.append({**base, "key": f"ag-{name}-{n}", "op": "all_gather"})
            cases.append({**base, "key": f"rs-{name}-{n}", "op": "reduce_scatter", "redop": "SUM"})
            cases.append({**base, "key": f"rsi-{name}-{n}", "op": "reduce_scatter_inplace",
                          "redop": "SUM"})
            cases.append({**base, "key": f"agi-{name}-{n}", "op": "all_gather_inplace"})
    for dtype in (torch.float16, torch.bfloat16, torch.complex64, torch.bool, torch.uint8):
        cases.append({"key": f"rs-{dtype}", "op": "reduce_scatter", "dtype": dtype, "n": 6,
                      "salt": 4, "redop": "SUM", "algorithms": FORCED["ring"]})
    big = 300_000  # > 256 KiB for every dtype: the default choice is the segmented ring/chain
    for op in ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter"):
        cases.append({"key": f"big-{op}", "op": op, "dtype": torch.float32, "n": big, "salt": 5,
                      "redop": "SUM", "root": ws - 1})
    cases.append({"key": "reduce-root-op", "op": "reduce_root_op", "dtype": torch.float32, "n": 5,
                  "salt": 12, "root": ws - 1, "redop": "MAX"})
    for n in (0, 1, 4):
        for root in {0, ws - 1}:
            cases.append({"key": f"ga-{n}-{root}", "op": "gather", "dtype": torch.bfloat16, "n": n,
                          "salt": 6, "root": root})
            cases.append({"key": f"sc-{n}-{root}", "op": "scatter", "dtype": torch.complex64,
                          "n": n, "salt": 7, "root": root})
        cases.append({"key": f"a2a-{n}", "op": "all_to_all", "dtype": torch.int16, "n": n + 1,
                      "salt": 8})
    cases.append({"key": "barrier", "op": "barrier", "dtype": torch.uint8, "n": 0, "salt": 0})
    return cases


def _check_case(case: dict, results: list[dict], ws: int) -> None:
    key, op, dtype, n, salt = case["key"], case["op"], case["dtype"], case["n"], case["salt"]
    got = [res[key] for res in results]
    root = case.get("root", 0)
    if op in ("all_reduce", "reduce", "reduce_root_op"):
        want = expected_reduce(_inputs(dtype, ws, salt, n), case["redop"])
        for r in range(ws) if op == "all_reduce" else [root]:
            _assert_same(got[r], want, f"{key} rank {r}", case["redop"])
    elif op == "broadcast":
        for r in range(ws):
            _assert_same(got[r], ranks.make_input(dtype, root, salt, n), f"{key} rank {r}")
    elif op in ("all_gather", "gather", "all_gather_inplace"):
        want = torch.cat(_inputs(dtype, ws, salt, n))
        for r in range(ws) if op != "gather" else [root]:
            _assert_same(got[r], want, f"{key} rank {r}")
    elif op == "scatter":
        full = ranks.make_input(dtype, root, salt, n * ws)
        for r in range(ws):
            _assert_same(got[r], full[r * n:(r + 1) * n], f"{key} rank {r}")
    elif op in ("reduce_scatter", "reduce_scatter_inplace"):
        full = expected_reduce(_inputs(dtype, ws, salt, n * ws), case["redop"])
        for r in range(ws):
            _assert_same(got[r], full[r * n:(r + 1) * n], f"{key} rank {r}")
    elif op == "all_to_all":
        for r in range(ws):
            parts = []
            for src in range(ws):
                splits = [ranks.a2a_split(src, j, n) for j in range(ws)]
                start = sum(splits[:r])
                total = sum(splits)
                parts.append(ranks.make_input(dtype, src, salt, total)[start:start + splits[r]])
            _assert_same(got[r], torch.cat(parts), f"{key} rank {r}")


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_op_algorithm_and_dtype_matches_torch(world_size: int) -> None:
    cases = _reduction_cases(world_size)
    results = run_ranks(ranks.run_cases, world_size, args=(cases,), timeout=100)
    for case in cases:
        _check_case(case, results, world_size)


@pytest.mark.parametrize("world_size", [3, 4])
def test_all_reduce_of_random_floats_is_bitwise_identical_on_every_rank(world_size: int) -> None:
    algos = ["all_reduce=direct", "all_reduce=recursive_doubling",
             "all_reduce=ring,segment=4000", "all_reduce=scatter_gather,segment=4000"]
    results = run_ranks(ranks.random_all_reduce, world_size, args=(algos, 5003), timeout=60)
    inputs = [torch.randn(5003, generator=torch.Generator().manual_seed(r * 7919 + i))
              for i in range(len(algos)) for r in range(world_size)]
    for k, got in enumerate(results[0]):
        i = k // 2
        want = sum(_wide(inputs[i * world_size + r].to(got.dtype)) for r in range(world_size))
        torch.testing.assert_close(_wide(got), want, rtol=0.05, atol=0.05)
        for r in range(1, world_size):
            other = results[r][k]
            assert torch.equal(other.view(torch.int16 if other.dtype is torch.bfloat16 else
                                          torch.int32),
                               got.view(torch.int16 if got.dtype is torch.bfloat16 else
                                        torch.int32)), f"{algos[i]}: rank {r} differs from rank 0"


def test_point_to_point_receives_first_out_of_order_tags_any_source_and_size_errors() -> None:
    results = run_ranks(ranks.p2p_scenarios, 3, timeout=60)
    for rank in (0, 1):
        assert results[rank]["src"] == 1 - rank
        assert torch.equal(results[rank]["both_recv_first"],
                           torch.arange(1000, dtype=torch.float32) + (1 - rank))
    assert results[1]["tags"] == (1, 2)
    name, message = results[1]["size_error"]
    assert name == "DistBackendError"
    assert re.search(r"rank 0 sent 12 bytes with tag 33, but the matching receive buffer holds "
                     r"20 bytes", message), message
    assert results[0]["any_source"] == (2, 2.0)


@pytest.mark.parametrize(("world_size", "kind", "detail"), [
    (2, "op", r"rank \d runs (all_reduce|broadcast) #1 \(float32, 32 bytes, (op SUM|root 0)\) "
              r"but rank \d sent (broadcast|all_reduce) #1 \(float32, 32 bytes, (root 0|op SUM)\)"),
    (3, "dtype", r"float64, 64 bytes"),
    (3, "size", r"36 bytes"),
])
def test_mismatched_collectives_fail_on_every_rank(world_size: int, kind: str,
                                                  detail: str) -> None:
    results = run_ranks(ranks.mismatch, world_size, args=(kind,), timeout=60)
    for rank, (name, message) in enumerate(results):
        assert name == "DistBackendError", f"rank {rank}: {name} {message}"
        assert "mismatched collectives" in message, f"rank {rank}: {message}"
    assert any(re.search(detail, message) for _, message in results), results


def test_a_rank_killed_mid_all_reduce_fails_the_others_within_seconds_naming_it() -> None:
    results = run_ranks(ranks.killed_rank, 3, args=(2,), timeout=60)
    assert results[2]["victim_signal"] == 9
    for rank in (0, 1):
        res = results[rank]
        name, message = res["first"]
        assert name == "DistBackendError", res
        assert re.search(r"all_reduce #\d+ on group 'kill' failed: .*rank 2 closed its "
                         r"connection", message), message
        assert res["failed_after"] < 10.0, res
        later_name, later = res["later"]
        assert later_name == "DistBackendError"
        assert later.startswith(f"barrier #{res['ops'] + 1} on group 'kill' failed: the group "
                                f"was aborted: "), later
        assert "rank 2 closed its connection" in later
        assert res["later_after"] < 0.5, res


def test_timeout_names_the_missing_rank_and_where_it_is_and_warns_while_stalled() -> None:
    results = run_ranks(ranks.timeout, 3, args=(2,), timeout=60)
    for rank in (0, 1):
        res = results[rank]
        name, message = res["error"]
        assert name == "DistBackendError", res
        # the first rank to time out aborts the group; the other may learn it from its frame
        assert re.fullmatch(r"(all_reduce #2 on group 'to' failed: the group was aborted: )?"
                            r"all_reduce #2 on group 'to' timed out after 0:00:0\d: ranks \[2\] "
                            r"did not arrive \(rank 2 is at broadcast #1 \(finished\)\)",
                            message), message
        assert res["after"] < 6.0, res
        assert any("has waited" in w and "ranks [2] did not arrive" in w
                   for w in res["warnings"]), res["warnings"]
    late_name, late_message = results[2]["late"]
    assert late_name == "DistBackendError"
    assert late_message.startswith("all_reduce #2 on group 'to' failed: the group was aborted: "
                                   "all_reduce #2 on group 'to' timed out after"), late_message


def test_ranks_on_another_host_use_tcp_with_the_job_secret_and_results_are_unchanged() -> None:
    results = run_ranks(ranks.mixed_hosts, 3, timeout=60)
    assert results[0]["kinds"] == [None, "UnixChannel", "TcpChannel"]
    assert results[1]["kinds"] == ["UnixChannel", None, "TcpChannel"]
    assert results[2]["kinds"] == ["TcpChannel", "TcpChannel", None]
    want_small = expected_reduce(_inputs(torch.float32, 3, 9, 10), "SUM")
    want_large = expected_reduce(_inputs(torch.float64, 3, 10, 100_000), "SUM")
    want_gathered = torch.cat(_inputs(torch.int32, 3, 11, 6))
    for rank, res in enumerate(results):
        _assert_same(res["small"], want_small, f"rank {rank} small")
        _assert_same(res["large"], want_large, f"rank {rank} large")
        _assert_same(res["gathered"], want_gathered, f"rank {rank} all_gather")


def test_a_rank_with_another_job_secret_cannot_join_the_group() -> None:
    results = run_ranks(ranks.wrong_secret, 2, timeout=60)
    name, message = results[0]
    assert name == "HandshakeError", results
    assert message == ("rank 1 failed to prove the job secret: RINGTORCH_SECRET differs between "
                       "this process and the server"), message
    name, message = results[1]
    assert name == "DistNetworkError", results
    assert message.startswith("rank 1 of group 'secret': ranks [0] did not connect in time "
                              "(refused: ["), message


def test_a_rank_killed_while_its_peer_waits_in_recv_fails_that_recv_naming_it() -> None:
    result = run_ranks(ranks.killed_during_recv, 2, timeout=60)[0]
    name, message = result["error"]
    assert name == "DistBackendError", result
    assert message.startswith("recv from rank 1 (tag 0) on group 'p2pkill' failed: the group was "
                              "aborted: rank 1 closed its connection to rank 0"), message
    assert result["after"] < 10.0, result


def test_a_rank_that_closes_its_group_is_gone_without_aborting_the_others() -> None:
    results = run_ranks(ranks.leaving_rank, 3, timeout=60)
    assert torch.equal(results[0]["got"], torch.full((3,), 2.0))
    assert torch.equal(results[2]["got"], torch.ones(3))
    assert results[0]["from_left"] == (
        "DistBackendError", "recv from rank 1 (tag 0) on group 'bye' failed: rank 1 has closed "
                            "its process group")

"""NativeBackend on real processes and sockets, world sizes 1-4: what the conformance suite
(tests/conformance/test_backend.py: every op x algorithm x dtype) does not cover: bitwise
agreement of random floats per algorithm, point to point scenarios, and the failures:
mismatched collectives, a rank killed mid all_reduce, timeouts, other hosts and secrets.

Ranks run tests/integration/_native_ranks.py; every expected value is computed here from the
ranks' inputs (``make_input``) with torch, in float64/int64, never with ringtorch.
"""

from __future__ import annotations

import re

import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _native_ranks as ranks


def _wide(t: torch.Tensor) -> torch.Tensor:
    if t.dtype.is_complex:
        return t.to(torch.complex128)
    if t.dtype.is_floating_point:
        return t.to(torch.float64)
    return t.to(torch.int64)


def _sum(inputs: list[torch.Tensor]) -> torch.Tensor:
    """The sum over ranks of ``inputs``, computed wide, in the inputs' dtype."""
    return torch.stack([_wide(t) for t in inputs]).sum(0).to(inputs[0].dtype)


def _assert_same(got: torch.Tensor, want: torch.Tensor, what: str, op: str = "") -> None:
    assert got.dtype == want.dtype, what
    if op == "AVG" and want.dtype in (torch.float16, torch.bfloat16):
        torch.testing.assert_close(got, want, msg=what)  # one rounding of the division
    else:
        assert torch.equal(got, want), f"{what}: got {got} want {want}"


def _inputs(dtype: torch.dtype, ws: int, salt: int, n: int) -> list[torch.Tensor]:
    return [ranks.make_input(dtype, r, salt, n) for r in range(ws)]


def test_reduce_applies_the_root_s_op_when_the_others_pass_another() -> None:
    results = run_ranks(ranks.reduce_with_the_root_op, 3, timeout=60)
    want = torch.stack(_inputs(torch.float32, 3, 12, 5)).amax(0)
    _assert_same(results[2], want, "the root's result")


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
        assert name == "PeerLostError", res  # a DistBackendError and a DistNetworkError
        assert re.search(r"all_reduce #\d+ on group 'kill' failed: .*rank 2 closed its "
                         r"connection", message), message
        assert res["failed_after"] < 10.0, res
        later_name, later = res["later"]
        assert later_name == "PeerLostError"
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
                            r"all_reduce #2 on group 'to' timed out after 0:00:0\d \(Timed out waiting "
                            r"\d+ms: the collective's timeout\): ranks \[2\] "
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
    want_small = _sum(_inputs(torch.float32, 3, 9, 10))
    want_large = _sum(_inputs(torch.float64, 3, 10, 100_000))
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
    assert name == "PeerLostError", result
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

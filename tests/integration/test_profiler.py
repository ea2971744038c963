"""torch.profiler sees ringtorch's communication as it sees torch's own backends'.

Ranks run collectives, point-to-point operations and RPCs inside ``torch.profiler.profile``;
the tests read the profiler's own outputs (``key_averages`` and the exported Chrome trace) for
the ranges, their names (torch's: "gloo:all_reduce", "rpc_sync#f(worker0 -> worker1)") and
their sizes, written out here from the tensors the ranks used.
"""

from __future__ import annotations

import pytest

import ringtorch.distributed as dist
from ringtorch.collectives import profiling
from ringtorch.testing import run_ranks
from tests.integration import _trace_ranks as ranks


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    base = tmp_path_factory.mktemp("profiler")
    return run_ranks(ranks.profiled, 2, args=(str(base),))


def _named(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e["name"] == name]


def _sizes(events: list[dict], collective: str) -> list[dict]:
    """The arguments of the sizes ranges of ``collective`` ("all_reduce", ...)."""
    return [e["args"] for e in _named(events, profiling.PARAMS)
            if e["args"]["Collective name"] == collective]


@pytest.mark.parametrize("rank", [0, 1])
def test_collectives_appear_as_torch_names_them_with_their_sizes(profiled: list[dict],
                                                                  rank: int) -> None:
    events, counts = profiled[rank]["events"], profiled[rank]["counts"]
    (reduce,) = _named(events, "gloo:all_reduce")  # the one outside the profiler is not there
    assert reduce["args"]["Input Dims"] == [[256]]
    # the sizes, in a range of their own opened at the issue (the layer1 one is renamed)
    (sizes, _renamed) = _sizes(events, "all_reduce")
    assert (sizes["nbytes"], sizes["In msg nelems"], sizes["Out msg nelems"]) == (
        1024, 256, 256)
    assert (sizes["dtype"], sizes["Group size"], sizes["Rank"]) == ("float32", 2, rank)
    assert sizes["Process Group Name"] == "0"
    assert reduce["ts"] <= _named(events, profiling.PARAMS)[0]["ts"] <= (
        reduce["ts"] + reduce["dur"])
    (gather,) = _sizes(events, "all_gather")
    assert (gather["In msg nelems"], gather["Out msg nelems"]) == (4, 8)
    (barrier,) = _sizes(events, "barrier")
    assert barrier["nbytes"] == 0
    assert counts[("gloo:all_reduce", "[[256]]")] == 1
    assert _named(events, "gloo:send" if rank == 0 else "gloo:recv")
    (p2p,) = _sizes(events, "send" if rank == 0 else "recv")
    assert p2p["Peer"] == 1 - rank and p2p["nbytes"] == 20


def test_an_asynchronous_collectives_range_lasts_from_issue_to_completion(
        profiled: list[dict]) -> None:
    # rank 0 issued an all_gather, then opened and closed a range of its own; only then could
    # rank 1 join, so the gather cannot have completed before that range ended
    events = profiled[0]["events"]
    (gather,) = _named(events, "gloo:all_gather")
    (away,) = _named(events, ranks.PEER_AWAY)
    assert gather["ts"] <= away["ts"]
    assert gather["ts"] + gather["dur"] >= away["ts"] + away["dur"]


@pytest.mark.parametrize("rank", [0, 1])
def test_record_comm_renames_the_collectives_issued_inside_it(profiled: list[dict],
                                                              rank: int) -> None:
    events, counts = profiled[rank]["events"], profiled[rank]["counts"]
    (renamed,) = _named(events, "layer1::grad all_reduce")
    assert renamed["args"]["Input Dims"] == [[64]]
    assert _sizes(events, "all_reduce")[1]["nbytes"] == 256
    assert ("gloo:all_reduce", "[[64]]") not in counts


def test_rpc_calls_appear_as_torch_names_them_with_their_sizes(profiled: list[dict]) -> None:
    events = profiled[0]["events"]
    function = f"{ranks.__name__}.square"
    (sync,) = _named(events, f"rpc_sync#{function}(worker0 -> worker1)")
    assert sync["args"]["nbytes"] == 64 and sync["args"]["Input Dims"] == [[16]]
    (call,) = _named(events, f"rpc_async#{function}(worker0 -> worker1)")
    assert call["args"]["nbytes"] == 24 and call["args"]["dst"] == "worker1"
    assert not [e for e in profiled[1]["events"] if e["name"].startswith("rpc_")]


def test_record_comm_nests_and_restores_the_name_in_force() -> None:
    assert profiling.title("gloo", "allreduce") == "gloo:all_reduce"
    with dist.record_comm("outer"):
        with dist.record_comm("inner"):
            assert profiling.title("gloo", "allreduce") == "inner"
        assert profiling.title("mpi", "broadcast") == "outer"
    assert profiling.title("mpi", "alltoall_base") == "mpi:all_to_all"


def test_record_comm_rejects_a_name_that_is_not_a_string() -> None:
    with pytest.raises(TypeError, match=r"^record_comm expects a str name, got int$"):
        with dist.record_comm(3):  # type: ignore[arg-type]
            pass

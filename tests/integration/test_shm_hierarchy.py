"""Groups spanning hosts: shared memory within each host, TCP between hosts (hierarchical
collectives, docs/design/shared-memory.md "Groups spanning hosts").

Hosts are faked with RINGTORCH_HOST_ID per rank, written as a string of host letters ("aabb":
ranks 0 and 1 on host a, ranks 2 and 3 on host b). Ranks run
tests/integration/_shm_hierarchy_ranks.py; expected values are computed here with torch from
the ranks' deterministic inputs (tests/integration/_shm_ranks.py's make_input/random_input).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
import torch

from ringtorch.collectives.algorithms.sockets.hierarchical import SubLink, Topology
from ringtorch.testing import run_ranks
from tests.integration import _shm_hierarchy_ranks as ranks
from tests.integration._shm_ranks import PREMUL_FACTOR, make_input, random_input

OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "barrier")
REDUCING = ("all_reduce", "reduce_scatter")
INT_REDOPS = ("SUM", "MAX", "PRODUCT")
FLOAT_REDOPS = ("AVG", "MAX", "PREMUL_SUM")  # SUM: the random-float test below


def _cases(world_size: int, full: bool) -> list[dict]:
    """Each op on int64 and float32; all_reduce and reduce_scatter with every reduction
    (``full``) or one per dtype; sizes 0 (``full``), 5 and 30 001 (the ranks run 16 KiB
    chunks, so 30 001 elements take many rounds; all_gather and reduce_scatter take the
    socket path at that size, so they also run 9 000); roots vary. ``reduce`` (the socket
    path in such groups) and ``barrier`` once each per dtype and size."""
    int_redops, float_redops = (INT_REDOPS, FLOAT_REDOPS) if full else (("MAX",), ("AVG",))
    out = []
    for op in OPS if full else [op for op in OPS if op != "reduce"]:
        for dtype, redops in ((torch.int64, int_redops), (torch.float32, float_redops)):
            gathers = op in ("all_gather", "reduce_scatter")
            sizes = (5, 9_000) if gathers else (5, 30_001)
            if full and (gathers or op == "all_reduce"):
                sizes = (0, *sizes, 30_001) if gathers else (0, *sizes)
            for n in sizes:
                for i, red in enumerate(redops if op in REDUCING else redops[:1]):
                    root = (n + i) % world_size
                    out.append({"key": f"{op}/{dtype}/{red}/{n}/{root}", "op": op,
                                "dtype": dtype, "n": n, "salt": len(out), "redop": red,
                                "root": root})
    return out


def _expected(case: dict, rank: int, ws: int) -> torch.Tensor | None:
    """What ``rank`` must hold after ``case``, computed with torch in float64 / int64."""
    op, dtype, n, root = case["op"], case["dtype"], case["n"], case["root"]
    if op == "barrier" or (op == "reduce" and rank != root):
        return None
    per = n * ws if op == "reduce_scatter" else n
    make = random_input if case.get("random") else make_input
    inputs = [make(dtype, j, case["salt"], per) for j in range(ws)]
    if op == "broadcast":
        return inputs[root]
    if op == "all_gather":
        return torch.cat(inputs)
    wide = torch.stack([t.to(torch.float64 if dtype.is_floating_point else torch.int64)
                        for t in inputs])
    red = case["redop"]
    if red in ("SUM", "AVG", "PREMUL_SUM"):
        total = wide.sum(0) * (PREMUL_FACTOR if red == "PREMUL_SUM" else 1)
        total = total / ws if red == "AVG" else total
    elif red == "MAX":
        total = wide.amax(0)
    elif red == "MIN":
        total = wide.amin(0)
    else:
        total = wide.prod(0)
    total = total.to(dtype)
    return total[rank * n:(rank + 1) * n] if op == "reduce_scatter" else total


def _no_segments_of(pids: list[int]) -> list[str]:
    """The files in /dev/shm that processes ``pids`` created (should be none)."""
    return [f for f in os.listdir("/dev/shm")
            if any(f.startswith(f"ringtorch_{pid}_") for pid in pids)]


TOPOLOGIES = {
    "aabb": "2 hosts: [0, 1] shm, [2, 3] shm; leaders [0, 2] over sockets",
    "aab": "2 hosts: [0, 1] shm, [2] alone; leaders [0, 2] over sockets",
    "aaab": "2 hosts: [0, 1, 2] shm, [3] alone; leaders [0, 3] over sockets",
    "abab": "2 hosts: [0, 2] shm, [1, 3] shm; leaders [0, 1] over sockets",
}


@pytest.mark.parametrize("hosts", sorted(TOPOLOGIES))
def test_every_collective_of_a_group_spanning_hosts_matches_torch(hosts):
    ws = len(hosts)
    cases = _cases(ws, full=hosts == "aabb")
    # hosts of equal size run all_reduces from 1 KiB sliced (every rank talks across), the
    # smaller ones through the leaders
    results = run_ranks(ranks.cases, ws, args=(hosts, cases, (), 1024), timeout=90)
    for rank, res in enumerate(results):
        # shared memory within each host, TCP to the other host, Unix sockets within it
        local = [r for r in range(ws) if hosts[r] == hosts[rank]]
        assert (res["uses_shm"], res["reason"], res["flat"]) == (True, "", False), res
        assert res["topology"] == TOPOLOGIES[hosts], (rank, res["topology"])
        assert res["domain"] == (local if len(local) > 1 else None), (rank, res["domain"])
        assert res["channels"] == {p: "unix" if hosts[p] == hosts[rank] else "tcp"
                                   for p in range(ws) if p != rank}, (rank, res["channels"])
        for case in cases:
            want = _expected(case, rank, ws)
            if want is not None:
                assert torch.equal(res[case["key"]], want), (rank, case["key"])
    assert _no_segments_of([res["pid"] for res in results]) == []


def test_results_equal_the_socket_paths_within_rounding_and_are_identical_on_every_rank():
    # random floats: the reduction order (host by host) shows in the last bits
    cases = [{"key": f"{op}/{n}", "op": op, "dtype": torch.float32, "n": n, "salt": i,
              "redop": "SUM", "random": True, "root": 0}
             for i, (op, n) in enumerate([("all_reduce", 7), ("all_reduce", 50_000),
                                          ("reduce_scatter", 9_000)])]
    hier = run_ranks(ranks.cases, 4, args=("aabb", cases))
    # RINGTORCH_SHM=0 on one rank turns shared memory off for the whole group
    sockets = run_ranks(ranks.cases, 4, args=("aabb", cases, (3,)))
    for rank in range(4):
        assert (sockets[rank]["uses_shm"], sockets[rank]["reason"]) == (
            False, "rank 3: disabled (RINGTORCH_SHM=0)")
        assert sockets[rank]["topology"] == "sockets"
    for case in cases:
        key = case["key"]
        for rank in range(4):
            want = _expected(case, rank, 4)
            got, ref = hier[rank][key], sockets[rank][key]
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got.double(), want.double(), rtol=1e-5, atol=1e-5)
        if case["op"] == "all_reduce":
            assert all(torch.equal(hier[r][key], hier[0][key]) for r in range(4)), key


def test_a_rank_killed_mid_all_reduce_in_a_mixed_job_is_named_by_the_others():
    results = run_ranks(ranks.killed_rank, 4, args=("aabb", 1), timeout=60)
    assert results[1]["victim_signal"] == 9
    for rank in (0, 2, 3):
        res = results[rank]
        name, message = res["first"]
        # seen through shared memory (its segment) or its sockets (EOF: PeerLostError)
        assert name in ("ShmPeerError", "DistBackendError", "PeerLostError"), message
        assert re.search(r"rank 1 (\(pid \d+\) died|(on host \S+ )?closed its connection)",
                         message), message
        assert res["failed_after"] < 5.0, res
        later_name, later = res["later"]
        assert later_name in ("DistBackendError", "PeerLostError"), later
        assert "the group was aborted" in later, later
        assert res["later_after"] < 1.0, res
    assert _no_segments_of([res["pid"] for res in results]) == []


@pytest.mark.parametrize(("hosts", "late"), [("aabb", 3), ("aab", 2)])
def test_a_late_rank_on_the_other_host_is_named_by_every_rank(hosts, late, tmp_path):
    # the others' deadline is 1 s. Rank 3 shares host b with a leader, which names it at
    # once; rank 2 is alone on host b (its own leader): rank 0's socket wait names it, up to
    # 2.5 s past the deadline (transports/hierarchy.py, CROSS_GRACE_S)
    results = run_ranks(ranks.late_rank, len(hosts), args=(hosts, late, str(tmp_path)),
                        timeout=60)
    for rank, (name, message) in enumerate(results):
        assert name in ("ShmPeerError", "DistBackendError"), (rank, message)
        if rank != late:
            assert re.search(rf"all_reduce #2 .*timed out after .*ranks \[{late}\] did not "
                             rf"arrive", message), (rank, message)


def test_an_abort_on_one_rank_ends_every_host_s_waits_with_its_reason():
    for rank, (name, message) in enumerate(run_ranks(ranks.aborted, 4, args=("aabb", 3))):
        assert name in ("ShmPeerError", "DistBackendError"), (rank, message)
        assert "rank 3 aborted the group: the user gave up" in message, (rank, message)


def test_a_host_calling_another_collective_than_the_other_host_fails_every_rank():
    # host b's leader receives host a's all_reduce frame in its broadcast
    results = run_ranks(ranks.mismatch, 4, args=("aabb", "23"), timeout=30)
    for rank, (name, message) in enumerate(results):
        assert name in ("ShmPeerError", "DistBackendError"), (rank, message)
        assert re.search(r"mismatch.*(all_reduce #1.*broadcast #1|broadcast #1.*all_reduce #1)",
                         message), (rank, message)


def test_a_subgroup_spanning_hosts_is_hierarchical_in_its_own_ranks():
    results = run_ranks(ranks.subgroup, 4, args=("aabb",))
    total = float(sum(range(1, 5)))
    for rank, res in enumerate(results):
        assert res["world/uses"]["topology"] == TOPOLOGIES["aabb"], res
        assert res["world/results"] == ([total] * 5, [3.0] * 3)
        if rank == 0:
            assert "sub/uses" not in res
            continue
        sub = res["sub/uses"]
        # subgroup ranks 0..2 are global ranks 1..3: host a holds only subgroup rank 0
        assert sub["topology"] == "2 hosts: [0] alone, [1, 2] shm; leaders [0, 1] over sockets"
        assert sub["domain"] == (None if rank == 1 else [1, 2]), sub
        assert res["sub/results"] == ([total - 1] * 5, [3.0] * 3)


def test_the_topology_groups_ranks_by_host_in_order_of_their_lowest_rank():
    topo = Topology.from_hosts(["y", "x", "y", "z", "x"])
    assert topo.hosts == ((0, 2), (1, 4), (3,))
    assert topo.host_of == (0, 1, 0, 2, 1)
    assert topo.leaders == (0, 1, 3)
    assert topo.representatives(4) == (0, 4, 3)
    assert not topo.contiguous and Topology.from_hosts("aab").contiguous
    assert topo.describe() == ("3 hosts: [0, 2] shm, [1, 4] shm, [3] alone; leaders [0, 1, 3] "
                               "over sockets")


class _RecordingLink:
    rank, size = 3, 5

    def __init__(self) -> None:
        self.calls: list = []

    def send(self, peer, data):
        self.calls.append(("send", peer))

    def recv(self, peer, into):
        self.calls.append(("recv", peer))

    def exchange(self, sends, recvs):
        self.calls.append(("exchange", [p for p, _ in sends], [p for p, _ in recvs]))

    def scratch(self, nbytes):
        return np.empty(nbytes, np.uint8)


def test_a_sublink_numbers_its_members_in_order_and_talks_to_their_group_ranks():
    full = _RecordingLink()
    link = SubLink(full, (1, 3, 4), 3)
    assert (link.rank, link.size) == (1, 3)
    buf = np.zeros(4, np.uint8)
    link.send(0, buf)
    link.recv(2, buf)
    link.exchange([(0, buf), (2, buf)], [(2, buf)])
    assert full.calls == [("send", 1), ("recv", 4), ("exchange", [1, 4], [4])]

"""A network partition between two hosts is a DistNetworkError on every rank, in seconds.

Two hosts are two network namespaces (ringtorch.testing.netns); the ranks loop on all_reduce
or on RPC calls across them; then the link is cut silently (every packet dropped) or taken
down. Every rank must raise a ``DistNetworkError`` (a ``DistError``) within the TCP user
timeout (RINGTORCH_TCP_USER_TIMEOUT_MS, 2 s here) plus a little, naming the operation, the
group, the peer that became unreachable and its host; then every process exits on its own.
docs/design/failure-detection.md, G8.
"""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ringtorch.testing.netns import TwoHosts

# long (the whole fault matrix runs in the slow stage: README, Tests)
pytestmark = [pytest.mark.netns, pytest.mark.slow]

RANKS = str(Path(__file__).with_name("_partition_ranks.py"))
HORIZON_MS = 2000
# from the cut to the error: the TCP user timeout, the retransmission timer's granularity
# and the abort reaching the ranks of the same host; generous for a loaded 2-core machine
BOUND_S = HORIZON_MS / 1000 + 4.0
UNREACHABLE = (r"no acknowledgement for 2 s \(the TCP user timeout, "
               r"RINGTORCH_TCP_USER_TIMEOUT_MS\)")


def _line(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """The next JSON line a rank prints, waiting at most ``timeout`` seconds."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"pid {proc.pid} printed nothing in {timeout} s"
    line = proc.stdout.readline()
    assert line, f"pid {proc.pid} exited early with {proc.wait()}"
    return dict(json.loads(line))


def _run(hosts: TwoHosts, workload: str, world_size: int, fault: str) -> list[dict[str, Any]]:
    """Start ``world_size`` ranks (the first half on host 0), wait until every one loops,
    apply ``fault``; return each rank's error report with ``after`` (seconds from the fault)
    once every rank has exited, and check that nothing is left in either host."""
    per_host = world_size // 2
    procs = []
    for rank in range(world_size):
        env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK":
               str(rank % per_host), "MASTER_ADDR": hosts.addresses[0], "MASTER_PORT": "29500",
               "RINGTORCH_TCP_USER_TIMEOUT_MS": str(HORIZON_MS), "RINGTORCH_SECRET": "s" * 32}
        procs.append(hosts.run(rank // per_host, [sys.executable, RANKS, workload], env,
                               stdout=subprocess.PIPE))
    for proc in procs:
        assert _line(proc, 60) == {"event": "looping"}
    cut_at = time.time()
    getattr(hosts, fault)()
    reports = []
    for proc in procs:
        report = _line(proc, BOUND_S + 10)
        assert report["event"] == "error", report
        report["after"] = report["at"] - cut_at
        reports.append(report)
    for rank, proc in enumerate(procs):
        assert _line(proc, 30) == {"event": "exited"}, f"rank {rank}"
        assert proc.wait(timeout=30) == 0, f"rank {rank}"
    assert hosts.pids(0) == [] and hosts.pids(1) == [], "a process outlived its job"
    return reports


def _assert_network_error(rank: int, report: dict[str, Any]) -> None:
    assert {"DistNetworkError", "DistError"} <= set(report["bases"]), (rank, report)
    assert report["after"] < BOUND_S, (rank, report)


@pytest.mark.parametrize("fault", ["partition", "link_down"])
def test_a_cut_between_two_hosts_fails_both_ranks_all_reduce_naming_the_other(fault):
    with TwoHosts() as hosts:
        reports = _run(hosts, "all_reduce", 2, fault)
        # a link taken down may also answer "network unreachable" to a send
        why = UNREACHABLE if fault == "partition" else \
            rf"({UNREACHABLE}|the network is unreachable \(a link is down or there is no route\))"
        for rank, report in enumerate(reports):
            _assert_network_error(rank, report)
            peer = 1 - rank
            assert re.fullmatch(
                rf"all_reduce #\d+ on group '0' failed: the group was aborted: rank {peer} on "
                rf"host {re.escape(hosts.addresses[peer])} is unreachable from rank {rank} of "
                rf"group '0': {why}; the network to that host failed or the host is down \(the "
                rf"process may still be running\)", report["message"]), report["message"]


def test_a_partition_fails_point_to_point_sends_and_receives_naming_the_other_rank():
    with TwoHosts() as hosts:
        reports = _run(hosts, "ping_pong", 2, "partition")
        for rank, report in enumerate(reports):
            _assert_network_error(rank, report)
            peer = 1 - rank
            assert report["type"] == "PeerLostError", report
            assert re.fullmatch(
                rf"(send to|recv from) rank {peer} \(tag 0\) on group '0' failed: the group was "
                rf"aborted: rank {peer} on host {re.escape(hosts.addresses[peer])} is unreachable "
                rf"from rank {rank} of group '0': {UNREACHABLE}; the network to that host failed "
                rf"or the host is down \(the process may still be running\)", report["message"]), \
                report["message"]


def test_a_partition_at_world_4_fails_every_rank_naming_the_hosts_cut_off():
    with TwoHosts() as hosts:
        reports = _run(hosts, "all_reduce", 4, "partition")
        for rank, report in enumerate(reports):
            _assert_network_error(rank, report)
            other = 1 - rank // 2  # the other host, and its ranks
            cut = [2 * other, 2 * other + 1]
            # whichever rank of this host lost a connection first tells the other
            mine = rf"[{2 * (1 - other)}{2 * (1 - other) + 1}]"
            assert re.fullmatch(
                rf"all_reduce #\d+ .*on group '0'.* failed: .*rank [{cut[0]}{cut[1]}] on host "
                rf"{re.escape(hosts.addresses[other])} is unreachable from rank {mine} of group "
                rf"'0': {UNREACHABLE}; the network to that host failed or the host is down \(the "
                rf"process may still be running\); ranks \[{cut[0]}, {cut[1]}\] on that host "
                rf"are cut off", report["message"]), report["message"]


def test_a_partition_fails_rpc_calls_both_ways_naming_the_worker_and_its_host():
    with TwoHosts() as hosts:
        reports = _run(hosts, "rpc", 2, "partition")
        for rank, report in enumerate(reports):
            _assert_network_error(rank, report)
            assert report["type"] == "RpcPeerUnreachableError", report
            peer = 1 - rank
            assert re.fullmatch(
                rf"RPC to worker 'worker{peer}' \(rank {peer}\) on host "
                rf"{re.escape(hosts.addresses[peer])} failed: the worker is unreachable from "
                rf"worker 'worker{rank}' \(rank {rank}\): {UNREACHABLE}; the network to its host "
                rf"failed or the host is down \(the worker may still be running\); call: "
                rf".*add on worker 'worker{peer}' \(rank {peer}\)", report["message"]), \
                report["message"]


def test_a_partition_from_the_store_host_fails_a_store_client_naming_host_and_port():
    with TwoHosts() as hosts:
        env = {"MASTER_ADDR": hosts.addresses[0], "MASTER_PORT": "29500",
               "RINGTORCH_TCP_USER_TIMEOUT_MS": str(HORIZON_MS), "RINGTORCH_SECRET": "s" * 32}
        # the server would linger for its client, whose goodbye the cut swallows
        server = hosts.run(0, [sys.executable, RANKS, "store_server"],
                           {**env, "RINGTORCH_STORE_LINGER_S": "0"},
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert _line(server, 60) == {"event": "serving"}
        client = hosts.run(1, [sys.executable, RANKS, "store_client"], env,
                           stdout=subprocess.PIPE)
        assert _line(client, 60) == {"event": "looping"}
        cut_at = time.time()
        hosts.partition()
        report = _line(client, BOUND_S + 10)
        assert report["event"] == "error", report
        _assert_network_error(0, {**report, "after": report["at"] - cut_at})
        store = rf"TCPStore {re.escape(hosts.addresses[0])}:29500"
        assert re.fullmatch(
            rf"{store} is unreachable: {UNREACHABLE}; the network to the store's host failed or "
            rf"that host is down \(the server, on rank 0, may still be running\)",
            report["message"]), report["message"]
        # the next request tries to connect again, briefly, and says the cut is still there
        again = _line(client, 30)
        assert again["event"] == "again" and again["type"] == "DistNetworkError", again
        assert re.fullmatch(
            rf"lost the connection to {store} \({store} is unreachable: {UNREACHABLE}\) and "
            rf"could not connect again within 1 s: the network to the store's host is still "
            rf"cut", again["message"]), again["message"]
        assert _line(client, 30) == {"event": "exited"}
        assert client.wait(timeout=30) == 0
        server.stdin.close()  # type: ignore[union-attr]
        assert server.wait(timeout=30) == 0
        assert hosts.pids(0) == [] and hosts.pids(1) == [], "a process outlived its job"

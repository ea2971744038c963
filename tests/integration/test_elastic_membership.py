"""``ringrun --nnodes MIN:MAX`` with the c10d rendezvous changes the world while the job runs:
a node started late joins at the next round (world N -> 2N), and a node whose launcher is
signalled leaves gracefully (2N -> N). Neither counts as a restart: every launcher runs with
``--max-restarts 0``, so a counted restart would end the job.

Two ringrun agents on this machine (and once on two network namespaces, as two hosts: a late
node joins, then leaves), both in the test's directory, run docs/launching.md's
elastic_demo.py: each worker appends (world, rank, the sum of an all_reduce of ones over the
world, restart count, node) to worlds.jsonl once per round, and they all stop at one step once
the test creates the file ``stop``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ringtorch.testing import wait_for
from ringtorch.testing.harness import job_port
from ringtorch.testing.netns import TwoHosts

SECRET = "0123456789abcdef" * 4

ROOT = Path(__file__).resolve().parents[2]


def demo_program() -> str:
    """docs/launching.md's elastic_demo.py, as the docs print it."""
    text = (ROOT / "docs" / "launching.md").read_text()
    section = text[text.index("### Elastic membership"):]
    program = re.search(r"```python\n(.*?)```", section, re.S)
    assert program, "docs/launching.md has no program under Elastic membership"
    return program.group(1)


def node_args(tmp_path: Path, endpoint: str, nproc: int, conf: str = "") -> list[str]:
    """ringrun's command line for one node of an elastic job of 1 to 2 nodes (it admits a
    newcomer at once)."""
    script = tmp_path / "elastic_demo.py"
    script.write_text(demo_program())
    args = ["--nnodes", "1:2", "--nproc-per-node", str(nproc), "--max-restarts", "0",
            "--monitor-interval", "0.2", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", endpoint, "--rdzv-id", "elastic",
            "--rdzv-conf", f"join_timeout=60,last_call_timeout=0{conf}", str(script)]
    return [sys.executable, "-m", "ringtorch.launcher", *args]


def start_node(tmp_path: Path, port: int, nproc: int) -> subprocess.Popen[str]:
    """One node's ringrun on this host."""
    return subprocess.Popen(node_args(tmp_path, f"127.0.0.1:{port}", nproc),
                            env={**os.environ, "RINGTORCH_SECRET": SECRET}, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def reports(out: Path, world: int) -> list[dict]:
    """The reports of every worker that ran in a world of ``world`` ranks, by rank."""
    log = out / "worlds.jsonl"
    lines = log.read_text().split("\n")[:-1] if log.exists() else []  # whole lines only
    found = [report for report in map(json.loads, lines) if report["world"] == world]
    return sorted(found, key=lambda report: (report["rank"], report["pid"]))


def stop_all(out: Path, nodes: list[subprocess.Popen[str]]) -> list[tuple[int, str]]:
    (out / "stop").touch()
    results = []
    for node in nodes:
        try:
            _, err = node.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            node.kill()
            _, err = node.communicate()
        results.append((node.returncode, err))
    return results


def test_a_late_node_grows_the_world_from_n_to_2n(tmp_path: Path) -> None:
    port = job_port()
    first = start_node(tmp_path, port, nproc=2)
    nodes = [first]
    try:
        alone = wait_for(lambda: len(reports(tmp_path, 2)) == 2 and reports(tmp_path, 2), 90,
                         "the first node's workers in a world of 2")
        nodes.append(start_node(tmp_path, port, nproc=2))
        grown = wait_for(lambda: len(reports(tmp_path, 4)) == 4 and reports(tmp_path, 4), 90,
                         "both nodes' workers in a world of 4")
    finally:
        results = stop_all(tmp_path, nodes)
    assert [code for code, _ in results] == [0, 0], results
    assert [(r["rank"], r["sum"], r["nodes"]) for r in alone] == [(0, 2.0, "1"), (1, 2.0, "1")]
    assert [(r["rank"], r["sum"], r["nodes"]) for r in grown] == [
        (rank, 4.0, "2") for rank in range(4)]
    assert sorted(r["node"] for r in grown) == ["0", "0", "1", "1"]
    assert {r["restart"] for r in alone + grown} == {"0"}  # admitting a node is free
    first_err = results[0][1]
    assert ("ringrun: node(s) waiting to join: restarting the worker group in a new round to "
            "admit them") in first_err, first_err


def test_a_node_that_leaves_gracefully_shrinks_the_world_back(tmp_path: Path) -> None:
    port = job_port()
    first = start_node(tmp_path, port, nproc=1)  # hosts the rendezvous store
    nodes = [first]
    try:
        wait_for(lambda: reports(tmp_path, 1), 90, "the first node's worker")
        second = start_node(tmp_path, port, nproc=1)
        nodes.append(second)
        wait_for(lambda: len(reports(tmp_path, 2)) == 2, 90, "both nodes in a world of 2")
        second.send_signal(signal.SIGTERM)
        shrunk = wait_for(lambda: len(reports(tmp_path, 1)) == 2 and reports(tmp_path, 1), 90,
                          "the first node's worker in a new world of 1")
    finally:
        results = stop_all(tmp_path, nodes)
    (first_code, first_err), (second_code, second_err) = results
    assert first_code == 0, first_err  # --max-restarts 0: a counted restart would end the job
    assert second_code == 128 + signal.SIGTERM, second_err
    assert [(r["world"], r["sum"], r["restart"]) for r in shrunk] == [(1, 1.0, "0")] * 2
    assert ("ringrun: a node left the job: restarting the worker group in a new round without "
            "it") in first_err, first_err
    assert ("ringrun: received SIGTERM: stopped 1 running worker(s); this node left the job, "
            "the other nodes go on without it") in second_err, second_err


@pytest.mark.netns
def test_a_late_node_on_another_host_grows_the_world_and_leaves_it_gracefully(
        tmp_path: Path) -> None:
    """The same across two network namespaces, in one job: host 1's node joins (1 -> 2), then
    is signalled and leaves (2 -> 1) while host 0's goes on. Each node reaches the other only
    through its address on the switch (the store's host is forced: neither address is the
    hostname's)."""
    with TwoHosts() as hosts:
        endpoint = f"{hosts.addresses[0]}:{job_port()}"
        env = {"RINGTORCH_SECRET": SECRET}
        nodes = [hosts.run(0, node_args(tmp_path, endpoint, 1, ",is_host=1"), env=env,
                           cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)]
        try:
            wait_for(lambda: reports(tmp_path, 1), 90, "host 0's worker")
            nodes.append(hosts.run(1, node_args(tmp_path, endpoint, 1, ",is_host=0"), env=env,
                                   cwd=tmp_path, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True))
            grown = wait_for(lambda: len(reports(tmp_path, 2)) == 2 and reports(tmp_path, 2),
                             90, "both hosts' workers in a world of 2")
            nodes[1].send_signal(signal.SIGTERM)  # ringrun itself: ip netns exec execs it
            shrunk = wait_for(lambda: len(reports(tmp_path, 1)) == 2 and reports(tmp_path, 1),
                              90, "host 0's worker in a new world of 1")
        finally:
            results = stop_all(tmp_path, nodes)
    (first_code, first_err), (second_code, second_err) = results
    assert first_code == 0, first_err  # --max-restarts 0: a counted restart would end the job
    assert second_code == 128 + signal.SIGTERM, second_err
    assert [(r["rank"], r["sum"], r["restart"]) for r in grown] == [(0, 2.0, "0"),
                                                                  (1, 2.0, "0")]
    assert sorted(r["node"] for r in grown) == ["0", "1"]
    assert [(r["world"], r["sum"], r["restart"], r["node"]) for r in shrunk] == [
        (1, 1.0, "0", "0")] * 2
    assert ("ringrun: a node left the job: restarting the worker group in a new round without "
            "it") in first_err, first_err
    assert ("ringrun: received SIGTERM: stopped 1 running worker(s); this node left the job, "
            "the other nodes go on without it") in second_err, second_err

"""Several launchers form one job: two "nodes" on this machine, each its own ringrun.

The workers meet through a ringtorch TCPStore on MASTER_ADDR:MASTER_PORT (authenticated with
the job secret, no torch import) and each reports every worker's identity, so a test sees
that the two launchers made one job with consistent ranks.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ringtorch.testing.harness import job_port

SECRET = "0123456789abcdef" * 4

MEET = r"""
import json, os, sys
from datetime import timedelta
from ringtorch.store import TCPStore
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                 timedelta(seconds=30))
me = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE",
                                 "LOCAL_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT")}
store.set("worker%d" % rank, json.dumps(me))
store.wait(["worker%d" % r for r in range(world)])
seen = [json.loads(store.get("worker%d" % r)) for r in range(world)]
with open(os.path.join(os.environ["OUT_DIR"], "rank%d.json" % rank), "w") as f:
    json.dump({"me": me, "seen": seen}, f)
if os.environ.get("FAIL_RANK") == str(rank) and me["TORCHELASTIC_RESTART_COUNT"] == "0":
    os._exit(5)
store.set("done%d" % rank, "")
if rank == 0:  # rank 0 hosts the store: leave last
    store.wait(["done%d" % r for r in range(world)])
"""

# FAIL_RANK fails once the other ranks' workers run (their marker files in OUT_DIR say so).
SLEEPER = r"""
import os, sys, time
out = os.environ.get("OUT_DIR")
if os.environ["RANK"] == os.environ.get("FAIL_RANK"):
    others = int(os.environ["WORLD_SIZE"]) - 1
    if out:  # under the tests' 60 s bound on the launchers, so that a hang names what never came
        from ringtorch.testing import wait_for
        wait_for(lambda: len([n for n in os.listdir(out) if n.startswith("up")]) >= others, 50,
                 "the other ranks' marker files")
    sys.exit(4)
if out:
    open(os.path.join(out, "up" + os.environ["RANK"]), "w").close()
time.sleep(600)
"""


def free_port() -> int:
    return job_port()  # below the ephemeral range: no outgoing connection takes it meanwhile


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ringtorch.launcher", *args],
                            env={**os.environ, "RINGTORCH_SECRET": SECRET, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs: list[subprocess.Popen[str]], timeout: float = 60) -> list[tuple[int, str]]:
    results = []
    for proc in procs:
        _, err = proc.communicate(timeout=timeout)
        results.append((proc.returncode, err))
    return results


def reports(directory: Path, world_size: int) -> list[dict]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(world_size)]


def test_two_static_nodes_form_one_job(tmp_path: Path) -> None:
    script = tmp_path / "meet.py"
    script.write_text(MEET)
    common = ["--nnodes", "2", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
              "--master-port", str(free_port())]
    nodes = [start([*common, "--node-rank", str(n), str(script)], {"OUT_DIR": str(tmp_path)})
             for n in (0, 1)]
    for code, err in finish(nodes):
        assert code == 0, err
    everyone = [{"RANK": str(r), "LOCAL_RANK": str(r % 2), "GROUP_RANK": str(r // 2),
                 "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                 "TORCHELASTIC_RESTART_COUNT": "0"} for r in range(4)]
    for report in reports(tmp_path, 4):
        assert report["seen"] == everyone


def c10d_args(port: int, *extra: str) -> list[str]:
    return ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id",
            "job1", "--rdzv-conf", "join_timeout=20,last_call_timeout=1", *extra]


def test_c10d_nodes_agree_on_their_ranks_without_node_ranks(tmp_path: Path) -> None:
    script = tmp_path / "meet.py"
    script.write_text(MEET)
    port = free_port()
    # Two nodes with different worker counts: 1 + 2 = 3 workers, ranks contiguous per node.
    nodes = [start([*c10d_args(port), "--nnodes", "2", "--nproc-per-node", str(n), str(script)],
                   {"OUT_DIR": str(tmp_path)}) for n in (1, 2)]
    for code, err in finish(nodes):
        assert code == 0, err
    seen = reports(tmp_path, 3)[0]["seen"]
    assert all(report["seen"] == seen for report in reports(tmp_path, 3))
    by_node: dict[str, list[int]] = {}
    for worker in seen:
        by_node.setdefault(worker["GROUP_RANK"], []).append(int(worker["RANK"]))
        assert worker["GROUP_WORLD_SIZE"] == "2"
    assert sorted(by_node) == ["0", "1"]
    assert sorted(len(ranks) for ranks in by_node.values()) == [1, 2]
    assert by_node["0"] == list(range(len(by_node["0"])))  # node 0 has the first ranks
    assert sorted(by_node["0"] + by_node["1"]) == [0, 1, 2]


def test_c10d_a_failure_on_one_node_restarts_both(tmp_path: Path) -> None:
    script = tmp_path / "meet.py"
    script.write_text(MEET)
    port = free_port()
    env = {"OUT_DIR": str(tmp_path), "FAIL_RANK": "1"}
    nodes = [start([*c10d_args(port, "--max-restarts", "1"), "--nnodes", "2",
                    "--nproc-per-node", "1", str(script)], env) for _ in range(2)]
    results = finish(nodes)
    for code, err in results:
        assert code == 0, err
    # Both nodes went through round 2, and both counted the restart.
    for _, err in results:
        assert "round 2 (restart 1 of 1)" in err
    assert [r["me"]["TORCHELASTIC_RESTART_COUNT"] for r in reports(tmp_path, 2)] == ["1", "1"]


def test_c10d_a_node_giving_up_stops_the_other(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    port = free_port()
    started = time.monotonic()
    nodes = [start([*c10d_args(port), "--nnodes", "2", "--nproc-per-node", "1", str(script)],
                   {"FAIL_RANK": "1", "OUT_DIR": str(tmp_path)}) for _ in range(2)]
    results = finish(nodes)
    assert time.monotonic() - started < 60  # not the 600 s the other node's worker sleeps
    assert [code for code, _ in results] == [1, 1]
    errs = "\n".join(err for _, err in results)
    assert "rank 1 (local rank 0) failed with exit code 4" in errs
    assert "stopped: node 1: rank 1 (local rank 0) failed with exit code 4" in errs


def test_c10d_too_few_nodes_time_out_with_a_message(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    port = free_port()
    node = start(["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                  "--rdzv-conf", "join_timeout=1", "--nnodes", "2", str(script)])
    ((code, err),) = finish([node])
    assert code == 1
    assert err.splitlines()[-1] == (
        f"ringrun: error: timed out after 1 s waiting for nodes to join round 1 at "
        f"127.0.0.1:{port}: 1 joined, --nnodes needs at least 2")


def test_c10d_unreachable_endpoint_fails_after_join_timeout(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    port = free_port()  # nobody listens there, and is_host=0 forbids hosting it
    node = start(["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                  "--rdzv-conf", "join_timeout=1,is_host=0", "--nnodes", "2", str(script)])
    ((code, err),) = finish([node])
    assert code == 1
    assert err.splitlines()[-1].startswith(
        f"ringrun: error: cannot reach the rendezvous endpoint 127.0.0.1:{port} within 1 s")


def test_c10d_a_node_with_another_secret_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    port = free_port()
    host = start([*c10d_args(port), "--nnodes", "2", str(script)])
    intruder = start(["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                      "--rdzv-conf", "join_timeout=20,is_host=0", "--nnodes", "2", str(script)],
                     {"RINGTORCH_SECRET": "not-the-job-secret"})
    ((code, err),) = finish([intruder])
    host.send_signal(signal.SIGINT)  # the host still waits for a second node
    ((host_code, host_err),) = finish([host])
    assert code == 1
    assert err.splitlines()[-1].startswith(
        f"ringrun: error: the rendezvous store at 127.0.0.1:{port} and this node do not share "
        f"the job secret: 127.0.0.1:{port} failed to prove the job secret"), err
    assert host_code == 128 + signal.SIGINT
    assert "ringrun: received SIGINT during the rendezvous" in host_err


def test_a_multi_node_launcher_without_any_secret_refuses_to_start(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    env = {k: v for k, v in os.environ.items() if k != "RINGTORCH_SECRET"}
    env["RINGTORCH_SECRET_FILE"] = ""  # no per-user secret file either
    result = subprocess.run([sys.executable, "-m", "ringtorch.launcher", "--nnodes", "2",
                             "--node-rank", "1", str(script)], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith(
        "ringrun: error: a multi-node job needs a job secret shared by every node, and there is "
        "no per-user secret file")

"""Authenticated by default: without RINGTORCH_SECRET, every process uses the per-user secret
file, so nodes sharing a home directory need no set-up and nodes that do not are told what to
do; a store server keeps the secret it was made with.

Each "node" here is a set of processes with its own RINGTORCH_SECRET_FILE, as two hosts with
their own home directories would have.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from ringtorch import _config
from ringtorch._wire.errors import HandshakeError
from ringtorch.store import TCPStore
from ringtorch.testing import wait_for
from ringtorch.testing.harness import job_port
from tests.integration.test_run_multinode import MEET, c10d_args, finish, reports

HAND_LAUNCHED = r"""
import os, sys, time
import torch
import ringtorch.distributed as dist
from ringtorch.testing import wait_for
rank, port, folder = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
t = torch.full((4,), float(rank + 1))
dist.all_reduce(t)
print(t.tolist(), flush=True)
open(os.path.join(folder, f"reduced{rank}"), "w").close()
# the job stays up meanwhile
wait_for(lambda: os.path.exists(os.path.join(folder, "tried")), 60, "the intruders' tries")
dist.barrier()
dist.destroy_process_group()
"""

INTRUDER = r"""
import sys
import time
from datetime import timedelta
from ringtorch.store import TCPStore
try:
    TCPStore("127.0.0.1", int(sys.argv[1]), None, False, timedelta(seconds=5))
    print("connected")
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}")
"""


def _env(secret_file: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RINGTORCH_SECRET"}
    return {**env, "RINGTORCH_SECRET_FILE": str(secret_file), **extra}


def test_a_store_server_keeps_the_secret_it_was_made_with() -> None:
    with _config.override(SECRET="the secret at construction"):
        store = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30))
    try:
        with _config.override(SECRET="set later in the same process"):
            with pytest.raises(HandshakeError, match=(
                    rf"^127\.0\.0\.1:{store.port} failed to prove the job secret: RINGTORCH_SECRET "
                    rf"differs between this process and the server$")):
                TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=5))
        with _config.override(SECRET="the secret at construction"):
            client = TCPStore("127.0.0.1", store.port, None, False, timedelta(seconds=5))
            client.set("k", "v")
            assert store.get("k") == b"v"
    finally:
        store.close()


def test_hand_launched_ranks_authenticate_with_the_shared_file_and_refuse_others(
        tmp_path: Path) -> None:
    shared = tmp_path / "home" / ".config" / "ringtorch" / "secret"
    script, intruder = tmp_path / "rank.py", tmp_path / "intruder.py"
    script.write_text(HAND_LAUNCHED)
    intruder.write_text(INTRUDER)
    port = job_port()
    ranks = [subprocess.Popen([sys.executable, str(script), str(r), str(port), str(tmp_path)],
                              env=_env(shared), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in (0, 1)]
    try:
        def reduced() -> bool:
            assert all(p.poll() is None for p in ranks), \
                [p.communicate() for p in ranks if p.poll() is not None]
            return all((tmp_path / f"reduced{r}").exists() for r in (0, 1))

        wait_for(reduced, 60, "both ranks to have reduced")
        other_home = tmp_path / "other-home" / "secret"
        no_file = subprocess.run([sys.executable, str(intruder), str(port)], capture_output=True,
                                 text=True, timeout=60, env={**_env(shared),
                                                             "RINGTORCH_SECRET_FILE": ""})
        another = subprocess.run([sys.executable, str(intruder), str(port)], capture_output=True,
                                 text=True, timeout=60, env=_env(other_home))
    finally:
        (tmp_path / "tried").write_text("")
    results = [p.communicate(timeout=60) for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0], results
    assert [r[0].splitlines()[0] for r in results] == ["[3.0, 3.0, 3.0, 3.0]"] * 2
    assert stat.S_IMODE(shared.stat().st_mode) == 0o600
    assert no_file.stdout.strip() == (
        f"HandshakeError: 127.0.0.1:{port} requires a job secret and this process has none: "
        f"set RINGTORCH_SECRET to the job's secret (ringrun sets it for its workers)")
    assert another.stdout.strip() == (
        f"HandshakeError: 127.0.0.1:{port} failed to prove the job secret: this process uses "
        f"the per-user secret file {other_home} (no RINGTORCH_SECRET is set) and the other side "
        f"holds another secret: copy that file to every node of the job (mode 0600), or set "
        f"RINGTORCH_SECRET to the same value on every process")


def _launcher(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ringtorch.launcher", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_multi_node_job_sharing_a_home_starts_with_no_setting(tmp_path: Path) -> None:
    script = tmp_path / "meet.py"
    script.write_text(MEET)
    shared = tmp_path / "home" / "secret"
    port = job_port()
    nodes = [_launcher([*c10d_args(port), "--nnodes", "2", "--nproc-per-node", "1", str(script)],
                       _env(shared, OUT_DIR=str(tmp_path))) for _ in range(2)]
    for code, err in finish(nodes):
        assert code == 0, err
        assert "WARNING" not in err, err
    assert [r["me"]["RANK"] for r in reports(tmp_path, 2)] == ["0", "1"]
    assert re.fullmatch(r"[0-9a-f]{64}\n", shared.read_text())


def test_nodes_with_different_secret_files_are_told_to_copy_it(tmp_path: Path) -> None:
    script = tmp_path / "meet.py"
    script.write_text(MEET)
    port = job_port()
    host = _launcher([*c10d_args(port), "--nnodes", "2", str(script)],
                     _env(tmp_path / "home0" / "secret", OUT_DIR=str(tmp_path)))
    other = tmp_path / "home1" / "secret"
    joiner = _launcher(["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                        "--rdzv-conf", "join_timeout=20,is_host=0", "--nnodes", "2", str(script)],
                       _env(other, OUT_DIR=str(tmp_path)))
    ((code, err),) = finish([joiner])
    host.terminate()  # it still waits for a second node
    finish([host])
    assert code == 1
    assert err.splitlines()[-1] == (
        f"ringrun: error: the rendezvous store at 127.0.0.1:{port} and this node do not share the "
        f"job secret: 127.0.0.1:{port} failed to prove the job secret: this process uses the "
        f"per-user secret file {other} (no RINGTORCH_SECRET is set) and the other side holds "
        f"another secret: copy that file to every node of the job (mode 0600), or set "
        f"RINGTORCH_SECRET to the same value on every process"), err

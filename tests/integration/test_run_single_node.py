"""ringrun on one node, run as users run it, in a subprocess.

The first test goes through ``python -m ringtorch.distributed.run`` and one through the
``ringrun`` console script; the others use ``python -m ringtorch.launcher``, the same command
line without the 1.5 s torch import that ``ringtorch.distributed`` costs. Workers are tiny
scripts without torch that report what they saw (environment, arguments) into files the test
reads; expected values are written out literally.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPORT = r"""
import json, os, sys
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_ERROR_FILE", "RINGTORCH_SECRET", "OMP_NUM_THREADS"]
report = {"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in keys}}
out = os.environ["REPORT_DIR"]
with open(os.path.join(out, "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(report, f)
"""

CHATTY = r"""
import os, sys
rank = os.environ["RANK"]
print("out line 1 of rank " + rank)
print("out line 2 of rank " + rank, flush=True)
print("err line of rank " + rank, file=sys.stderr)
sys.stdout.write("no newline at the end " + rank)
"""


def ringrun(args: list[str], env: dict[str, str] | None = None, timeout: float = 60,
            module: str = "ringtorch.launcher") -> subprocess.CompletedProcess[str]:
    """Run the CLI to completion."""
    full_env = {**os.environ, **(env or {})}
    full_env.pop("OMP_NUM_THREADS", None)
    return subprocess.run([sys.executable, "-m", module, *args],
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def reports(directory: Path, world_size: int) -> list[dict]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(world_size)]


def test_every_worker_gets_torchruns_environment(tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    result = ringrun(["--nproc-per-node", "3", "--max-restarts", "2", "--rdzv-id", "job42",
                      str(script), "--lr", "0.5"], env={"REPORT_DIR": str(tmp_path)},
                     module="ringtorch.distributed.run")
    assert result.returncode == 0, result.stderr
    seen = reports(tmp_path, 3)
    ports = {r["env"]["MASTER_PORT"] for r in seen}
    secrets = {r["env"]["RINGTORCH_SECRET"] for r in seen}
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536  # one free port for the whole job
    assert len(secrets) == 1 and len(secrets.pop()) == 64  # one fresh 32-byte hex secret
    for rank, report in enumerate(seen):
        env = report["env"]
        assert report["argv"] == ["--lr", "0.5"]  # ringrun passes no --local-rank (use_env)
        assert (env["RANK"], env["LOCAL_RANK"], env["ROLE_RANK"]) == (str(rank),) * 3
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["ROLE_WORLD_SIZE"]) == ("3",) * 3
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"], env["ROLE_NAME"]) == (
            "0", "1", "default")
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("0", "2")
        assert env["TORCHELASTIC_RUN_ID"] == "job42"
        assert env["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/{rank}/error.json")
        assert env["OMP_NUM_THREADS"] == "1"
    assert "Setting OMP_NUM_THREADS environment variable for each process to be 1" in result.stderr


def test_a_secret_set_by_the_user_reaches_every_worker(tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    result = ringrun(["--nproc_per_node=2", str(script)],
                     env={"REPORT_DIR": str(tmp_path), "RINGTORCH_SECRET": "my-job-secret"})
    assert result.returncode == 0, result.stderr
    assert [r["env"]["RINGTORCH_SECRET"] for r in reports(tmp_path, 2)] == ["my-job-secret"] * 2


def test_tee_prefixes_console_lines_and_redirect_writes_only_files(tmp_path: Path) -> None:
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    logs = tmp_path / "logs"
    # local rank 0: both streams teed (console with [default0]: + files); local rank 1: stdout
    # redirected to its file only, stderr on the console without a prefix.
    result = ringrun(["--nproc-per-node", "2", "--tee", "0:3", "--redirects", "1:1",
                      "--log-dir", str(logs), "--rdzv-id", "logtest", str(script)])
    assert result.returncode == 0, result.stderr
    out_lines = result.stdout.splitlines()
    assert "[default0]:out line 1 of rank 0" in out_lines
    assert "[default0]:out line 2 of rank 0" in out_lines
    assert "[default0]:no newline at the end 0" in out_lines
    assert "out line 1 of rank 1" not in result.stdout  # redirected: file only
    assert "[default0]:err line of rank 0" in result.stderr.splitlines()
    assert "err line of rank 1" in result.stderr.splitlines()  # not teed: no prefix
    (run_dir,) = logs.iterdir()
    assert run_dir.name.startswith("logtest_")
    attempt = run_dir / "attempt_0"
    assert (attempt / "0" / "stdout.log").read_text() == (
        "out line 1 of rank 0\nout line 2 of rank 0\nno newline at the end 0")
    assert (attempt / "0" / "stderr.log").read_text() == "err line of rank 0\n"
    assert (attempt / "1" / "stdout.log").read_text() == (
        "out line 1 of rank 1\nout line 2 of rank 1\nno newline at the end 1")
    assert not (attempt / "1" / "stderr.log").exists()


def test_local_ranks_filter_hides_the_other_ranks_on_the_console(tmp_path: Path) -> None:
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    result = ringrun(["--nproc-per-node", "3", "--tee", "1", "--local-ranks-filter", "1",
                      str(script)])
    assert result.returncode == 0, result.stderr
    assert "[default1]:out line 1 of rank 1" in result.stdout.splitlines()
    assert "rank 0" not in result.stdout and "rank 2" not in result.stdout
    assert "err line of rank 2" not in result.stderr


def test_module_no_python_and_run_path_modes(tmp_path: Path) -> None:
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(REPORT)
    result = ringrun(["-m", "mypkg.train", "x"],
                     env={"REPORT_DIR": str(tmp_path), "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert reports(tmp_path, 1)[0]["argv"] == ["x"]

    shell = tmp_path / "job.sh"
    shell.write_text('#!/bin/sh\necho "shell rank $RANK of $WORLD_SIZE args $*"\n')
    shell.chmod(0o755)
    result = ringrun(["--no-python", "--nproc-per-node", "2", "--tee", "1", str(shell), "a"])
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[default0]:shell rank 0 of 2 args a",
                                                  "[default1]:shell rank 1 of 2 args a"]

    (tmp_path / "rank0.json").unlink()
    result = ringrun(["--run-path", str(package / "train.py"), "y"],
                     env={"REPORT_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert reports(tmp_path, 1)[0]["argv"] == ["y"]


def test_ringrun_console_script_runs_a_job(tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    ringrun_bin = Path(sys.executable).parent / "ringrun"
    result = subprocess.run([str(ringrun_bin), "--standalone", "--nproc-per-node", "2",
                             str(script)], env={**os.environ, "REPORT_DIR": str(tmp_path)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert [r["env"]["RANK"] for r in reports(tmp_path, 2)] == ["0", "1"]

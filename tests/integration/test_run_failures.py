"""When a worker fails, ringrun stops the others, names the failure, restarts or gives up.

Also bad input that only the running launcher can find (a busy port): a clear message and a
non-zero exit, never a hang. Each test runs the real CLI in a subprocess.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

# A worker's wait gives up after 50 s, under ringrun's 60 s, so that a hung test names what
# never came.

# Rank 2 fails through @record (imported from the public path, as users do); the others
# would sleep for ten minutes if nobody stopped them.
RANK2_RAISES = r"""
import os, sys, time
rank = int(os.environ["RANK"])
out = os.environ["OUT_DIR"]
if rank == 2:
    from ringtorch.distributed.elastic.multiprocessing.errors import record
    from ringtorch.testing import wait_for

    @record
    def main():
        wait_for(lambda: len([n for n in os.listdir(out) if n.startswith("pid")]) >= 3, 50,
                 "the other ranks' pid files")
        with open(os.path.join(out, "failed_at"), "w") as f:
            f.write(repr(time.time()))
        raise ValueError("rank 2 cannot go on")

    main()
else:  # written whole, then renamed: rank 2 may fail (and ringrun stop us) at once
    with open(os.path.join(out, ".pid%d" % rank), "w") as f:
        f.write(str(os.getpid()))
    os.rename(os.path.join(out, ".pid%d" % rank), os.path.join(out, "pid%d" % rank))
    time.sleep(600)
"""

# Rank 1 is killed once ranks 0 and 2 run (their marker files say so).
RANK1_KILLED = r"""
import os, signal, time
out = os.environ["OUT_DIR"]
if os.environ["RANK"] == "1":
    from ringtorch.testing import wait_for
    wait_for(lambda: len([n for n in os.listdir(out) if n.startswith("up")]) >= 2, 50,
             "ranks 0 and 2 to be up")
    os.kill(os.getpid(), signal.SIGKILL)
open(os.path.join(out, "up" + os.environ["RANK"]), "w").close()
time.sleep(600)
"""

# Rank 0 fails only once rank 1 ignores SIGTERM (before that, SIGTERM would simply kill it).
IGNORES_SIGTERM = r"""
import os, signal, sys, time
ready = os.path.join(os.environ["OUT_DIR"], "ignoring")
if os.environ["RANK"] == "0":
    from ringtorch.testing import wait_for
    wait_for(lambda: os.path.exists(ready), 50, "rank 1 to ignore SIGTERM")
    sys.exit(7)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(ready, "w").close()
time.sleep(600)
"""

FLAKY = r"""
import os, signal
count = os.environ["TORCHELASTIC_RESTART_COUNT"]
with open(os.path.join(os.environ["OUT_DIR"], "seen"), "a") as f:
    f.write("rank %s restart %s\n" % (os.environ["RANK"], count))
if count == "0" and os.environ["RANK"] == "1":
    # Die only once rank 0 has written its line, or ringrun may stop rank 0 before it starts.
    from ringtorch.testing import wait_for
    seen = os.path.join(os.environ["OUT_DIR"], "seen")
    wait_for(lambda: "rank 0 restart 0" in open(seen).read(), 50, "rank 0's line in " + seen)
    os.kill(os.getpid(), signal.SIGKILL)
"""

ALWAYS_FAILS = r"""
import os, sys
with open(os.path.join(os.environ["OUT_DIR"], "attempts"), "a") as f:
    f.write(os.environ["TORCHELASTIC_RESTART_COUNT"] + "\n")
sys.exit(3)
"""


def ringrun(args: list[str], env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringtorch.launcher", *args],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_failing_rank_stops_the_others_and_the_summary_names_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script = write(tmp_path, "train.py", RANK2_RAISES)
    result = ringrun(["--nproc-per-node", "4", script], env={"OUT_DIR": str(out)})
    ended = time.time()
    assert result.returncode == 1
    assert ended - float((out / "failed_at").read_text()) < 60.0  # not the ranks' 600 s sleep
    for rank in (0, 1, 3):
        assert not alive(int((out / f"pid{rank}").read_text())), f"rank {rank} survived"
    err = result.stderr
    assert "ringrun: rank 2 (local rank 2) failed with exit code 1; stopping 3 other running " \
           "worker(s)" in err
    summary = err[err.index("train.py FAILED"):]
    root = summary[summary.index("Root Cause (first observed failure):"):]
    assert re.search(r"rank      : 2 \(local_rank: 2\)\n  exitcode  : 1 \(pid: \d+\)\n", root)
    assert "raise ValueError(\"rank 2 cannot go on\")" in root
    assert "ValueError: rank 2 cannot go on" in root
    assert "<NO_OTHER_FAILURES>" in summary  # the ranks stopped by ringrun are not failures


def test_a_rank_killed_by_a_signal_is_named_with_the_signal(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", RANK1_KILLED)
    result = ringrun(["--nproc-per-node", "3", script], {"OUT_DIR": str(tmp_path)})
    assert result.returncode == 1
    root = result.stderr[result.stderr.index("Root Cause"):]
    assert re.search(r"rank      : 1 \(local_rank: 1\)\n  exitcode  : -9 \(pid: (\d+)\) "
                     r"\(SIGKILL\)\n", root)
    assert re.search(r"traceback : Signal 9 \(SIGKILL\) received by PID \d+", root)


def test_a_worker_ignoring_sigterm_is_killed_after_the_shutdown_timeout(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", IGNORES_SIGTERM)
    started = time.monotonic()
    result = ringrun(["--nproc-per-node", "2", "--shutdown-timeout", "1", script],
                     env={"OUT_DIR": str(tmp_path)})
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert "rank 0 (local rank 0) failed with exit code 7; stopping 1 other running" in \
           result.stderr
    assert 1.0 <= elapsed < 60.0  # not the 600 s rank 1 would sleep


def test_max_restarts_restarts_the_group_with_a_new_round(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", FLAKY)
    result = ringrun(["--nproc-per-node", "2", "--max-restarts", "1", script],
                     env={"OUT_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert sorted((tmp_path / "seen").read_text().splitlines()) == [
        "rank 0 restart 0", "rank 0 restart 1", "rank 1 restart 0", "rank 1 restart 1"]
    assert "ringrun: rank 1 (local rank 1) failed with signal SIGKILL" in result.stderr
    assert "ringrun: round 2 (restart 1 of 1): starting the worker group" in result.stderr


def test_the_job_fails_after_the_last_restart(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", ALWAYS_FAILS)
    result = ringrun(["--max-restarts", "2", script], env={"OUT_DIR": str(tmp_path)})
    assert result.returncode == 1
    assert (tmp_path / "attempts").read_text().splitlines() == ["0", "1", "2"]
    assert "train.py FAILED" in result.stderr
    assert "exitcode  : 3" in result.stderr


def test_a_master_port_in_use_is_an_error_naming_it(tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", "raise SystemExit('must not run')\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = ringrun(["--nproc-per-node", "2", "--master-port", str(port), script])
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"ringrun: error: --master-port {port}: port {port} on 127.0.0.1 is already in use; "
        f"stop the process that holds it or choose another port (port 0 picks a free one). "
        f"Pass another --master-port, or leave it out on a single node to get a free port")
    assert "must not run" not in result.stderr


def test_an_unknown_flag_and_a_missing_script_fail_before_anything_starts(
        tmp_path: Path) -> None:
    result = ringrun(["--nproc-per-nod", "2", "--no-such-flag", "train.py"])
    assert result.returncode == 2
    assert "ringrun: error: unrecognized arguments: --no-such-flag" in result.stderr
    result = ringrun(["--nproc-per-node", "0", str(tmp_path / "missing.py")])
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "ringrun: error: --nproc-per-node must be at least 1 (or one of auto, cpu, gpu), got 0")

"""Nothing of a job outlives its launcher: Ctrl-C, SIGTERM and even SIGKILL to ringrun.

Each worker starts a child in its own process group and one that escapes into a new session
(``setsid``); the test records every descendant of the launcher from the process table before
signalling it, and afterwards checks, in the process table again, that none is left, escapees
included, even after a SIGKILL that gave the launcher no chance to clean up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ringtorch._workers.guardian import JOB_MARK_VAR, kill_marked, marked_processes
from ringtorch.testing import wait_for

WORKER = r"""
import os, subprocess, sys, time
from ringtorch.testing import wait_for
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
escaped = os.path.join(os.environ["OUT_DIR"], "escaped%s" % os.environ["RANK"])
escapee = [sys.executable, "-c", "import os, sys, time; os.setsid(); "
           "open(sys.argv[1], 'w').close(); time.sleep(600)", escaped]
children = [subprocess.Popen(sleeper), subprocess.Popen(escapee)]
wait_for(lambda: os.path.exists(escaped), 50, "the escapee to call setsid")
with open(os.path.join(os.environ["OUT_DIR"], "ready%s" % os.environ["RANK"]), "w") as f:
    f.write(" ".join(str(c.pid) for c in children))
time.sleep(600)
"""


def proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) for every process, read from /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            table[int(name)] = (int(fields[1]), fields[0])
    return table


def descendants(pid: int) -> set[int]:
    table = proc_table()
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, _) in table.items():
            if ppid == parent and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def still_running(pids: set[int]) -> set[int]:
    table = proc_table()
    return {pid for pid in pids if pid in table and table[pid][1] != "Z"}


def start_job(tmp_path: Path, nproc: int) -> tuple[subprocess.Popen[str], set[int]]:
    """Start ringrun with ``nproc`` workers; return it once every worker has its children."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ringtorch.launcher", "--nproc-per-node", str(nproc),
         "--shutdown-timeout", "3", str(script)],
        env={**os.environ, "OUT_DIR": str(tmp_path)}, stderr=subprocess.PIPE, text=True)
    def started() -> bool:
        assert launcher.poll() is None, launcher.communicate()[1]
        return len(list(tmp_path.glob("ready*"))) == nproc

    wait_for(started, 30, "the workers and their children to start")
    job = descendants(launcher.pid)
    for ready in tmp_path.glob("ready*"):
        job |= {int(pid) for pid in ready.read_text().split()}
    assert len(job) >= 3 * nproc  # each worker and its two children (plus the guardian)
    return launcher, job


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_launcher_stops_every_process_of_the_job(tmp_path: Path,
                                                                 sig: signal.Signals) -> None:
    launcher, job = start_job(tmp_path, nproc=3)
    launcher.send_signal(sig)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 128 + sig
    assert f"ringrun: received {sig.name}: stopped 3 running worker(s)" in err
    assert still_running(job) == set(), err


def test_sigkill_to_the_launcher_kills_the_workers_and_every_descendant(tmp_path: Path) -> None:
    launcher, job = start_job(tmp_path, nproc=2)
    escapees = {int(ready.read_text().split()[1]) for ready in tmp_path.glob("ready*")}
    assert escapees <= job
    launcher.kill()
    launcher.wait(timeout=30)  # not communicate(): the escapees may hold its stderr pipe a while
    launcher.stderr.close()
    try:
        # The workers die by their parent-death signal, their process groups by the guardian,
        # and the setsid escapees by the guardian's sweep of the job's mark.
        wait_for(lambda: not still_running(job), 30, "every process of the job to die")
    finally:
        for pid in still_running(job):
            os.kill(pid, signal.SIGKILL)


def test_the_guardians_sweep_kills_only_the_processes_carrying_the_jobs_mark() -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    marked = subprocess.Popen(sleeper, env={**os.environ, JOB_MARK_VAR: "job-1"},
                              start_new_session=True)
    other_job = subprocess.Popen(sleeper, env={**os.environ, JOB_MARK_VAR: "job-2"})
    unmarked = subprocess.Popen(sleeper)
    try:
        wait_for(lambda: marked.pid in marked_processes("job-1"), 30,  # its exec completed
                 "the marked process to carry its mark")
        assert kill_marked("job-1") == 1
        assert marked.wait(timeout=30) == -signal.SIGKILL
        assert other_job.poll() is None and unmarked.poll() is None
    finally:
        for proc in (marked, other_job, unmarked):
            proc.kill()
            proc.wait()


DIES_HOLDING_A_SEGMENT = r"""
import os, sys
from ringtorch._wire.shm import Segment
if os.environ["RANK"] == "1":
    segment = Segment.create(132 * 1024)  # as in shared-memory setup, before peers map it
    with open(os.path.join(os.environ["OUT_DIR"], "segment"), "w") as f:
        f.write(segment.name)
    os._exit(3)  # dies without unlinking it
"""


def test_a_segment_left_by_a_dying_worker_is_gone_when_the_job_ends(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(DIES_HOLDING_A_SEGMENT)
    result = subprocess.run([sys.executable, "-m", "ringtorch.launcher", "--nproc-per-node", "2",
                             str(script)], env={**os.environ, "OUT_DIR": str(tmp_path)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "exit code 3" in result.stderr, result.stderr
    name = (tmp_path / "segment").read_text()
    assert not os.path.exists(os.path.join("/dev/shm", name))  # at once: no age to wait for


STOPPED_WORKER = r"""
import os, signal, sys, time
from ringtorch.testing import wait_for
marker = os.path.join(os.environ["OUT_DIR"], "stopping")
if os.environ["RANK"] == "1":
    open(marker, "w").close()
    os.kill(os.getpid(), signal.SIGSTOP)  # frozen: acts on no signal until continued
    time.sleep(600)  # held here on purpose: only ringrun's stop may end it
wait_for(lambda: os.path.exists(marker), 60, "rank 1 about to stop itself")
sys.exit(3)  # rank 0 fails: ringrun stops the job, the frozen rank 1 included
"""


def test_a_worker_frozen_by_sigstop_is_stopped_without_waiting_out_the_grace(
        tmp_path: Path) -> None:
    # A stopped process acts on SIGTERM only once it runs again: ringrun continues it
    # (SIGCONT after SIGTERM, as a shell does), so the job ends at once, not after the
    # 60 s shutdown timeout and a SIGKILL.
    script = tmp_path / "worker.py"
    script.write_text(STOPPED_WORKER)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "ringtorch.launcher", "--nproc-per-node", "2",
         "--shutdown-timeout", "60", str(script)],
        env={**os.environ, "OUT_DIR": str(tmp_path)}, capture_output=True, text=True,
        timeout=120)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    assert "exit code 3" in done.stderr, done.stderr
    assert elapsed < 30, (elapsed, done.stderr)

"""Nothing of a job outlives its launcher: Ctrl-C, SIGTERM and even SIGKILL to ringrun.

Each worker starts a child in its own process group and one that escapes into a new session
(``setsid``); the test records every descendant of the launcher from the process table before
signalling it, and afterwards checks, in the process table again, that none is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = r"""
import os, subprocess, sys, time
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
escaped = os.path.join(os.environ["OUT_DIR"], "escaped%s" % os.environ["RANK"])
escapee = [sys.executable, "-c", "import os, sys, time; os.setsid(); "
           "open(sys.argv[1], 'w').close(); time.sleep(600)", escaped]
children = [subprocess.Popen(sleeper), subprocess.Popen(escapee)]
while not os.path.exists(escaped):  # the escapee has called setsid
    time.sleep(0.01)
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
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("ready*"))) < nproc:
        assert time.monotonic() < deadline, "workers did not start"
        assert launcher.poll() is None, launcher.communicate()[1]
        time.sleep(0.02)
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


def test_sigkill_to_the_launcher_kills_the_workers_and_their_children(tmp_path: Path) -> None:
    launcher, job = start_job(tmp_path, nproc=2)
    escapees = set()
    for ready in tmp_path.glob("ready*"):
        escapees.add(int(ready.read_text().split()[1]))
    launcher.kill()
    launcher.wait(timeout=30)  # not communicate(): the escapees still hold its stderr pipe
    launcher.stderr.close()
    deadline = time.monotonic() + 30
    while still_running(job - escapees) and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        # The workers die by their parent-death signal, their process groups by the guardian.
        assert still_running(job - escapees) == set()
    finally:
        for pid in still_running(job):  # the setsid escapees are out of reach (documented)
            os.kill(pid, signal.SIGKILL)

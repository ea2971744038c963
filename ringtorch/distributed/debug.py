"""``python -m ringtorch.distributed.debug <job>``: the hang report of a running job, from
another shell.

``<job>`` is one of:

* the pid of the job's ``ringrun`` (or ``python -m ringtorch.distributed.run``) launcher, or
  its run directory (the launcher leaves its pid there as ``ringrun.pid``): the launcher is
  sent SIGUSR1, makes the report (it prints it on its own stderr too) and this command prints
  the report the launcher saved;
* ``host:port`` of the job's store (``MASTER_ADDR:MASTER_PORT``) for a job started without
  ringrun: this command asks the ranks itself, merges their answers and saves the report.
  It proves the job secret like any client (``RINGTORCH_SECRET`` or the per-user secret file).

Either way no rank is stopped, and nothing waits longer than a few seconds
(``RINGTORCH_HANG_REPORT_WAIT_S`` for the ranks' answers). Example::

    $ ringrun --nproc-per-node 4 train.py &       # it hangs
    $ python -m ringtorch.distributed.debug $!    # which rank, where, doing what
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import sys
import tempfile
import time
from datetime import timedelta

from ringtorch import _config
from ringtorch._observe.hang_ask import ask, current_world, key, write_report
from ringtorch.store import TCPStore

PID_FILE = "ringrun.pid"  # written by the launcher into its run directory
_LAUNCHER_WORDS = ("ringrun", "ringtorch.distributed.run", "ringtorch.distributed.launch",
                   "ringtorch.launcher")


class DebugError(RuntimeError):
    """The job could not be asked (the message says why)."""


def launcher_pid(job: str) -> int:
    """The launcher's pid from ``job`` (a pid or a run directory).

    Raises:
        DebugError: no such process, or it is not a ringtorch launcher (SIGUSR1 would kill
            another program), or the directory holds no launcher pid.
    """
    if os.path.isdir(job):
        try:
            with open(os.path.join(job, PID_FILE)) as f:
                job = f.read().strip()
        except OSError:
            raise DebugError(f"{job} is not a ringrun run directory (it has no {PID_FILE})") \
                from None
    pid = int(job)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        raise DebugError(f"no process {pid}: is the job still running?") from None
    if not any(word in command for word in _LAUNCHER_WORDS):
        raise DebugError(f"process {pid} is not a ringrun launcher ({command.strip()[:80]!r}); "
                         f"give the launcher's pid, its run directory or the store's host:port")
    return pid


def via_launcher(pid: int, wait_s: float) -> tuple[str, str]:
    """Send SIGUSR1 to the launcher and return (report, path) once it has saved it."""
    pattern = os.path.join(tempfile.gettempdir(), f"hang-report-ringrun-*-{pid}.txt")
    before = set(glob.glob(pattern))
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        new = sorted(set(glob.glob(pattern)) - before)
        if new:
            with open(new[-1]) as f:
                return f.read(), new[-1]
        time.sleep(0.1)  # the launcher writes the file when its report is done
    raise DebugError(f"the launcher (pid {pid}) made no report within {wait_s:g} s (do its "
                     f"workers use ringtorch, with RINGTORCH_HANG_REPORT on?)")


def via_store(address: str, world_size: int | None) -> tuple[str, str]:
    """Ask the ranks of the job whose store is at ``address`` (host:port) directly."""
    host, _, port = address.rpartition(":")
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5),
                     wait_for_workers=False)
    try:
        if world_size is None:
            if not store.check([key("info", 0)]):
                raise DebugError(f"no rank of the job at {address} takes part in hang reports "
                                 f"(RINGTORCH_HANG_REPORT=0, or no process group yet)")
            world_size = int(json.loads(store.get(key("info", 0)))["world_size"])
        reason = f"asked by python -m ringtorch.distributed.debug (pid {os.getpid()})"
        ranks = current_world(store, world_size)  # after a shrink or a grow back: its ranks
        answers = ask(store, world_size, reason, _config.HANG_REPORT_WAIT_S.get(), ranks=ranks)
    finally:
        store.close()
    return write_report(answers, world_size, reason, "debug", ranks=ranks)


def main(argv: list[str] | None = None) -> int:
    """The command; 0 when a report was printed, 1 otherwise (the reason on stderr)."""
    parser = argparse.ArgumentParser(prog="python -m ringtorch.distributed.debug",
                                     description="Print the hang report of a running job.")
    parser.add_argument("job", help="ringrun's pid, its run directory, or the store's host:port")
    parser.add_argument("--world-size", type=int, default=None,
                        help="ranks of a job asked through its store (default: as rank 0 says)")
    parser.add_argument("--wait", type=float, default=30.0,
                        help="seconds to wait for the launcher's report")
    args = parser.parse_args(argv)
    try:
        if ":" in args.job and not os.path.isdir(args.job):
            text, path = via_store(args.job, args.world_size)
        else:
            text, path = via_launcher(launcher_pid(args.job), args.wait)
    except (DebugError, ValueError, OSError, RuntimeError) as exc:
        print(f"ringtorch.distributed.debug: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(text)
    print(f"(saved in {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

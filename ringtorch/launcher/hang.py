"""ringrun's hang report: on SIGUSR1, and on SIGINT/SIGTERM before it stops the workers.

The launcher asks every rank of the job's current world (after a shrink or a grow back, the
ranks its ranks published; docs/recovery.md) for its flight record and stacks through the job's
store (``_observe/hang_ask.py``), gets the stacks of its own workers that do not answer by
SIGUSR1 (faulthandler writes them into ``<observe dir>/stacks-<rank>.txt`` without the
worker's cooperation), merges everything into one report (``_observe/hang_report.py``),
prints it on stderr and saves it. The rule this module keeps: it never delays a stop by more
than a few seconds, and does nothing at all for a job whose workers do not use ringtorch
(none of them wrote a stacks file).

Reports are saved in the run directory when it is kept (``--log-dir``) and always as
``<tmp>/hang-report-ringrun-<time>-<launcher pid>.txt``, where
``python -m ringtorch.distributed.debug <launcher pid>`` finds them.
"""

from __future__ import annotations

import glob
import os
import sys
from datetime import timedelta
from typing import Any

from ringtorch import _config
from ringtorch._observe.hang_ask import ask, current_world, write_report
from ringtorch._observe.hang_report import Answer
from ringtorch._observe.hang_signal import parse_header, signal_stacks
from ringtorch._workers import console_write
from ringtorch.launcher.messages import say
from ringtorch.launcher.workers import LocalWorkerGroup
from ringtorch.store import TCPStore

PID_FILE = "ringrun.pid"
_CONNECT_S = 2.0


def mark_run_dir(run_dir: str) -> None:
    """Leave the launcher's pid in its run directory (the debug command signals it)."""
    try:
        with open(os.path.join(run_dir, PID_FILE), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        pass


def registered_workers(observe_dir: str, pids: set[int]) -> dict[int, dict[str, Any]]:
    """rank -> stacks-file header of each worker of ``pids`` that takes part in hang reports."""
    found: dict[int, dict[str, Any]] = {}
    for path in glob.glob(os.path.join(observe_dir, "stacks-*.txt")):
        try:
            with open(path) as f:
                header = parse_header(f.readline())
        except OSError:
            continue
        if header is not None and header["pid"] in pids:
            found[int(header["rank"])] = {**header, "stacks_file": path}
    return found


def report(reason: str, observe_dir: str, pids: set[int], master: tuple[str, int],
           world_size: int, run_dir: str | None) -> str | None:
    """Make, print and save the hang report of a running job; its path (None: no worker
    of this node takes part, or the report is turned off)."""
    if not _config.HANG_REPORT.get():
        return None
    local = registered_workers(observe_dir, pids)
    if not local:
        return None
    answers: list[Answer] = []
    ranks = list(range(world_size))  # after a shrink or a grow back: the current world's
    try:
        store = TCPStore(master[0], master[1], is_master=False,
                         timeout=timedelta(seconds=_CONNECT_S), wait_for_workers=False)
        try:
            ranks = current_world(store, world_size)
            answers = ask(store, world_size, reason, _config.HANG_REPORT_WAIT_S.get(),
                          ranks=ranks)
        finally:
            store.close()
    except Exception as exc:  # no store (rank 0 gone or stuck): the local stacks still tell
        say(f"the job's store did not answer ({exc}); reporting this node's workers from "
            f"their stacks")
    known = {a.rank for a in answers}
    for rank, header in sorted(local.items()):
        if rank not in known and rank in ranks:
            stacks = signal_stacks(header["pid"], header["stacks_file"])
            answers.append(Answer(rank, None, stacks, header["main_thread"], header["host"],
                                  header["pid"], "no answer through the store; stacks by "
                                  "SIGUSR1"))
    text, path = write_report(answers, world_size, reason, "ringrun", run_dir, ranks=ranks)
    console_write(sys.stderr, text + f"ringrun: hang report saved in {path}\n")
    return path


def report_group(reason: str, group: LocalWorkerGroup, keep_files: bool) -> str | None:
    """:func:`report` for the launcher's current worker group; a report that cannot be made
    is said in one line, never raised into the launcher's loop."""
    where = group.assignment
    run_dir = os.path.dirname(group.attempt_dir) if keep_files else None
    try:
        return report(reason, group.observe_dir, group.pids(),
                      (where.master_addr, where.master_port), where.world_size, run_dir)
    except Exception as exc:
        say(f"no hang report: {exc}")
        return None


__all__ = ["PID_FILE", "mark_run_dir", "registered_workers", "report", "report_group"]

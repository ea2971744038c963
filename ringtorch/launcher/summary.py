"""The failure summary the launcher prints last: which rank failed first, how, and why.

Modelled on torch elastic's ``ChildFailedError`` table, root cause first in spirit: the root
cause is the failure whose process exited first (exit times come from pidfds, exact to the
millisecond), so a rank that crashed is named rather than the peers that failed because of
it. The traceback comes from the worker's error file (``@record``); without one the summary
says how to get it.
"""

from __future__ import annotations

import socket
from datetime import datetime

from ringtorch._workers import NOT_AVAILABLE, describe_exit
from ringtorch.launcher.workers import WorkerFailure

_WIDTH = 60


def _format_one(index: int, failure: WorkerFailure, host: str, keep_files: bool) -> str:
    detail = failure.detail
    when = datetime.fromtimestamp(failure.exited_at).isoformat(sep="_", timespec="milliseconds")
    how = f" ({detail.signal_name()})" if failure.exitcode < 0 else ""
    note = ("" if keep_files or detail.error_file == NOT_AVAILABLE
            else " (removed at exit; pass --log-dir to keep it)")
    traceback = detail.traceback().rstrip("\n").replace("\n", "\n    ")
    return "\n".join([
        f"[{index}]:",
        f"  time      : {when}",
        f"  host      : {host}",
        f"  rank      : {failure.global_rank} (local_rank: {failure.local_rank})",
        f"  exitcode  : {failure.exitcode} (pid: {failure.pid}){how}",
        f"  error_file: {detail.error_file}{note}",
        f"  traceback : {traceback}",
    ])


def root_cause(failures: list[WorkerFailure]) -> WorkerFailure:
    """The failure that happened first."""
    return min(failures, key=lambda f: (f.exited_at, f.global_rank))


def format_summary(title: str, failures: list[WorkerFailure], host: str | None = None,
                   keep_files: bool = True) -> str:
    """The whole summary block for ``failures`` (at least one); ``keep_files`` False says the
    error files are in a temporary directory removed at exit."""
    host = host or socket.getfqdn()
    first = root_cause(failures)
    others = sorted((f for f in failures if f is not first), key=lambda f: f.exited_at)
    other_text = "\n".join(_format_one(i + 1, f, host, keep_files) for i, f in enumerate(others))
    return "\n".join([
        "=" * _WIDTH,
        f"{title} FAILED",
        "-" * _WIDTH,
        "Failures:",
        other_text or "  <NO_OTHER_FAILURES>",
        "-" * _WIDTH,
        "Root Cause (first observed failure):",
        _format_one(0, first, host, keep_files),
        "=" * _WIDTH,
    ])


def one_line(failure: WorkerFailure) -> str:
    """``"rank 2 (local rank 2) failed with exit code 1"``."""
    return (f"rank {failure.global_rank} (local rank {failure.local_rank}) failed with "
            f"{describe_exit(failure.exitcode)}")


__all__ = ["format_summary", "one_line", "root_cause"]

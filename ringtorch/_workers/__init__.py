"""Process supervision shared by ringrun and spawn: start, watch and stop children; error files.

The rule it keeps: no child outlives its supervisor. Workers lead their own process groups
and carry a parent-death signal; teardown signals whole groups, escalates to SIGKILL after a
grace period and reaps everything. Never imports torch (or anything else from ringtorch).
"""

from __future__ import annotations

from ringtorch._workers.errorfile import (
    ERROR_FILE_ENV,
    NOT_AVAILABLE,
    ChildFailedError,
    ErrorHandler,
    ProcessFailure,
    get_error_handler,
    record,
    write_error_file,
)
from ringtorch._workers.forked import ForkedWorker
from ringtorch._workers.guardian import JOB_MARK_VAR, Guardian
from ringtorch._workers.lifeline import (
    become_subreaper,
    death_signal_preexec,
    set_parent_death_signal,
)
from ringtorch._workers.output import LineCopier, console_write, route_stream
from ringtorch._workers.process import (
    Stoppable,
    WorkerProcess,
    WorkerStartError,
    describe_exit,
    reap_adopted,
    stop_processes,
    wait_any,
    wait_gone,
)

__all__ = [
    "ERROR_FILE_ENV",
    "NOT_AVAILABLE",
    "ChildFailedError",
    "ErrorHandler",
    "ForkedWorker",
    "Guardian",
    "JOB_MARK_VAR",
    "LineCopier",
    "console_write",
    "ProcessFailure",
    "Stoppable",
    "WorkerProcess",
    "WorkerStartError",
    "become_subreaper",
    "death_signal_preexec",
    "describe_exit",
    "get_error_handler",
    "reap_adopted",
    "record",
    "route_stream",
    "set_parent_death_signal",
    "stop_processes",
    "wait_any",
    "wait_gone",
    "write_error_file",
]

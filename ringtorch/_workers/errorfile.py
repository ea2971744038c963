"""Error files: a worker writes why it failed; the supervisor reads it and names the root cause.

The format is torch elastic's, so that tools reading ``TORCHELASTIC_ERROR_FILE`` keep working
and so that a worker decorated with torch's own ``record`` reports to ringrun and back:

    {"message": {"message": "ValueError: bad batch",
                 "extraInfo": {"py_callstack": "Traceback (most recent call last): ...",
                               "timestamp": "1700000000"}}}

A worker writes it through the :func:`record` decorator (re-exported as
``ringtorch.distributed.elastic.multiprocessing.errors.record``) around its entry point; the
launcher sets ``TORCHELASTIC_ERROR_FILE`` to a fresh path for each worker and attempt.
Nothing here is pickled: the file is JSON, read only by the supervisor of the same job.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import socket
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import wraps
from typing import Any, TypeVar

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
NOT_AVAILABLE = "<N/A>"

_R = TypeVar("_R")


class ErrorHandler:
    """Writes the exception that ends a worker to ``TORCHELASTIC_ERROR_FILE``, as torch's does.

    Subclass it and pass it to ``record(fn, error_handler=...)`` to change what is written.
    """

    def _get_error_file_path(self) -> str | None:
        return os.environ.get(ERROR_FILE_ENV)

    def initialize(self) -> None:
        """Turn on faulthandler, so a hard crash still leaves a traceback on stderr."""
        try:
            faulthandler.enable(all_threads=True)
        except Exception as exc:
            warnings.warn(f"Unable to enable fault handler. {type(exc).__name__}: {exc}",
                          stacklevel=2)

    def record_exception(self, e: BaseException) -> None:
        """Write ``e`` with the current traceback to the error file (when one is set)."""
        path = self._get_error_file_path()
        if path:
            write_error_file(path, e, traceback.format_exc())

    def dump_error_file(self, rootcause_error_file: str, error_code: int = 0) -> None:
        """Copy a child's error file into this process's own (a supervisor of supervisors)."""
        with open(rootcause_error_file) as f:
            self.record_child_error(json.load(f), error_code)

    def record_child_error(self, data: dict[str, Any], error_code: int = 0) -> None:
        """Write a child's error-file contents as this process's own error."""
        if error_code and isinstance(data.get("message"), dict):
            data = {**data, "message": {**data["message"], "errorCode": error_code}}
        path = self._get_error_file_path()
        if path:
            if os.path.isfile(path):
                os.remove(path)
            with open(path, "w") as f:
                json.dump(data, f)


def get_error_handler() -> ErrorHandler:
    """The default error handler."""
    return ErrorHandler()


def write_error_file(path: str, exc: BaseException, callstack: str) -> None:
    """Write ``exc`` and its formatted traceback to ``path`` in torch elastic's JSON format."""
    data = {
        "message": {
            "message": f"{type(exc).__name__}: {exc}",
            "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))},
        }
    }
    with open(path, "w") as f:
        json.dump(data, f)


@dataclass
class ProcessFailure:
    """A failed worker: who, how it ended, and why (from its error file, when it wrote one)."""

    local_rank: int
    pid: int
    exitcode: int
    error_file: str
    error_file_data: dict[str, Any] = field(init=False)
    message: str = field(init=False)
    timestamp: int = field(init=False)

    def __post_init__(self) -> None:
        self.error_file_data = {"message": NOT_AVAILABLE}
        self.message, self.timestamp = "", int(time.time())
        if self.error_file and os.path.isfile(self.error_file):
            try:
                with open(self.error_file) as f:
                    self.error_file_data = json.load(f)
                self.message, self.timestamp = _message_and_time(self.error_file_data)
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.message = f"<unreadable error file {self.error_file}: {exc}>"
        else:
            self.error_file = NOT_AVAILABLE
        if not self.message:
            if self.exitcode < 0:
                self.message = (f"Signal {-self.exitcode} ({self.signal_name()}) received by "
                                f"PID {self.pid}")
            else:
                self.message = ("To see the traceback, decorate the entry point with "
                                "@record (from ringtorch.distributed.elastic.multiprocessing."
                                "errors import record)")

    def signal_name(self) -> str:
        """``"SIGKILL"`` for a worker killed by a signal, ``"<N/A>"`` otherwise."""
        if self.exitcode >= 0:
            return NOT_AVAILABLE
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return NOT_AVAILABLE

    def timestamp_isoformat(self) -> str:
        """The failure's time as ``YYYY-MM-DD_HH:MM:SS``."""
        return datetime.fromtimestamp(self.timestamp).isoformat(sep="_")

    def traceback(self) -> str:
        """The worker's traceback when its error file has one, else the message."""
        message = self.error_file_data.get("message")
        if isinstance(message, dict):
            return str(message.get("extraInfo", {}).get("py_callstack", message.get("message")))
        return self.message


def _message_and_time(data: dict[str, Any]) -> tuple[str, int]:
    message = data["message"]
    if isinstance(message, str):
        return message, int(data.get("timestamp", 0))
    return str(message["message"]), int(message["extraInfo"]["timestamp"])


class ChildFailedError(Exception):
    """Raised by a supervisor whose child failed: ``failures`` maps global rank to failure.

    The message is torch's table (title, the other failures, then the root cause with its
    time, host, rank, exit code, error file and traceback), so logs read the same under
    either launcher. Raised inside a ``@record`` function, it copies the root cause's error
    into the supervisor's own error file, so a chain of supervisors reports the worker's
    error, not its own.
    """

    def __init__(self, name: str, failures: dict[int, ProcessFailure]) -> None:
        if not failures:
            raise ValueError("ChildFailedError needs at least one failure")
        self.name = name
        self.failures = failures
        super().__init__(self.format_msg())

    def get_first_failure(self) -> tuple[int, ProcessFailure]:
        """The root cause: the earliest failure by error-file timestamp (first observed on ties)."""
        rank = min(self.failures, key=lambda r: self.failures[r].timestamp)
        return rank, self.failures[rank]

    def format_msg(self, boarder_delim: str = "=", section_delim: str = "-") -> str:
        """The failure table (torch's layout and argument names, spelling included)."""
        title = f"{self.name} FAILED"
        root_rank, _ = self.get_first_failure()
        blocks = {rank: _format_failure(index, rank, failure)
                  for index, (rank, failure) in enumerate(self.failures.items())}
        width = min(60, max([len(title)] + [len(line) for block in blocks.values()
                                            for line in block.split("\n")]))
        others = [block for rank, block in blocks.items() if rank != root_rank]
        return "\n".join([
            "", boarder_delim * width, title, section_delim * width, "Failures:",
            "\n".join(others or ["  <NO_OTHER_FAILURES>"]), section_delim * width,
            "Root Cause (first observed failure):", blocks[root_rank], boarder_delim * width,
        ])


def _format_failure(index: int, rank: int, failure: ProcessFailure) -> str:
    message = failure.error_file_data.get("message")
    if isinstance(message, dict):
        text = str(message.get("extraInfo", {}).get("py_callstack",
                                                      message.get("message", NOT_AVAILABLE)))
        text = text.replace("\n", "\n  ")
    else:
        text = failure.message
    signal_name = failure.signal_name()
    how = f" ({signal_name})" if signal_name != NOT_AVAILABLE else ""
    return "\n".join([
        f"[{index}]:",
        f"  time      : {failure.timestamp_isoformat()}",
        f"  host      : {socket.getfqdn()}",
        f"  rank      : {rank} (local_rank: {failure.local_rank})",
        f"  exitcode  : {failure.exitcode} (pid: {failure.pid}) {how}",
        f"  error_file: {failure.error_file}",
        f"  traceback : {text}",
    ])


def record(fn: Callable[..., _R],
           error_handler: ErrorHandler | None = None) -> Callable[..., _R | None]:
    """Decorate a worker's entry point so that an exception ending it lands in its error file.

    The exception is still raised (the worker exits non-zero with the usual traceback on
    stderr); ``SystemExit(0)`` returns None. Use it once, on the top-level ``main``.
    """
    handler = error_handler or get_error_handler()

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> _R | None:
        handler.initialize()
        try:
            return fn(*args, **kwargs)
        except SystemExit as exc:
            if exc.code in (0, None):
                return None
            raise
        except ChildFailedError as exc:
            _, failure = exc.get_first_failure()
            if os.path.isfile(failure.error_file):
                handler.dump_error_file(failure.error_file, failure.exitcode)
            elif failure.error_file != NOT_AVAILABLE:  # read before its directory was removed
                handler.record_child_error(failure.error_file_data, failure.exitcode)
            raise
        except Exception as exc:
            handler.record_exception(exc)
            raise

    return wrapper


__all__ = [
    "ERROR_FILE_ENV",
    "ChildFailedError",
    "ErrorHandler",
    "ProcessFailure",
    "get_error_handler",
    "record",
    "write_error_file",
]

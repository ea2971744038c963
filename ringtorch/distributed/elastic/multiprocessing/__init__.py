"""``torch.distributed.elastic.multiprocessing``: what programs that launch workers import
from it: ``Std``, the log specs ``elastic_launch``'s ``LaunchConfig`` takes, ``SignalException``
and ``ProcessFailure``; the ``errors`` module (``record``, ``ChildFailedError``).

Workers are started and supervised by ringtorch's launcher (``ringtorch.launcher``); torch's
``start_processes`` and process contexts are not provided. Never imports torch.
"""

from __future__ import annotations

import signal

from ringtorch._workers import ProcessFailure
from ringtorch.launcher.config import Std


class SignalException(Exception):
    """Raised in a launching program whose launcher received a termination signal."""

    def __init__(self, msg: str, sigval: signal.Signals) -> None:
        super().__init__(msg)
        self.sigval = sigval


class LogsSpecs:
    """Where the workers' output goes: a log directory, redirects and tees per local rank."""

    def __init__(self, log_dir: str | None = None, redirects: Std | dict[int, Std] = Std.NONE,
                 tee: Std | dict[int, Std] = Std.NONE,
                 local_ranks_filter: set[int] | None = None) -> None:
        self._root_log_dir = log_dir
        self._redirects = redirects
        self._tee = tee
        self._local_ranks_filter = local_ranks_filter

    @property
    def root_log_dir(self) -> str | None:
        """The directory the run's logs and error files go under (None: a temporary one,
        removed at the end)."""
        return self._root_log_dir


class DefaultLogsSpecs(LogsSpecs):
    """torch's default log specs: ``{log_dir}/{run_id}_*/attempt_N/LOCAL_RANK/`` files."""

    def __init__(self, log_dir: str | None = None, redirects: Std | dict[int, Std] = Std.NONE,
                 tee: Std | dict[int, Std] = Std.NONE,
                 local_ranks_filter: set[int] | None = None) -> None:
        if log_dir is not None and not isinstance(log_dir, str):
            raise TypeError(f"log_dir must be a str or None, got {type(log_dir).__name__}")
        super().__init__(log_dir, redirects, tee, local_ranks_filter)


__all__ = ["DefaultLogsSpecs", "LogsSpecs", "ProcessFailure", "SignalException", "Std"]

"""``torch.distributed.elastic.multiprocessing.errors.error_handler``: the ErrorHandler that
``record`` uses to write a worker's error file (see the package)."""

from __future__ import annotations

from ringtorch._workers.errorfile import ErrorHandler

__all__ = ["ErrorHandler"]

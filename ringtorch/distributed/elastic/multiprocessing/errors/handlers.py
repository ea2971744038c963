"""``torch.distributed.elastic.multiprocessing.errors.handlers``: ``get_error_handler``."""

from __future__ import annotations

from ringtorch._workers.errorfile import get_error_handler

__all__ = ["get_error_handler"]

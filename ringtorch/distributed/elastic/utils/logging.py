"""``torch.distributed.elastic.utils.logging``: ``get_logger``, torch elastic's module logger.

The level comes from the ``LOGLEVEL`` environment variable (torch's), WARNING by default.
"""

from __future__ import annotations

import inspect
import logging
import os

from ringtorch.distributed.elastic.utils.log_level import get_log_level


def get_logger(name: str | None = None) -> logging.Logger:
    """A logger named ``name``, or after the calling module, at level ``LOGLEVEL``."""
    if name is None:
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        name = caller.f_globals.get("__name__") if caller is not None else None
    logger = logging.getLogger(name)
    logger.setLevel(os.environ.get("LOGLEVEL", get_log_level()))
    return logger


__all__ = ["get_logger"]

"""``torch.distributed.elastic.utils.log_level``: the default level of torch elastic's
loggers."""

from __future__ import annotations


def get_log_level() -> str:
    """The default log level (``LOGLEVEL`` overrides it in ``get_logger``)."""
    return "WARNING"


__all__ = ["get_log_level"]

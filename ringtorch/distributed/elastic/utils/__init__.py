"""``torch.distributed.elastic.utils``: helpers programs import around launching: environment
look-ups, free ports, the ``${local_rank}`` macro (here), a logger (``logging``), store
barriers (``store``) and a rendezvous store (``distributed``)."""

from __future__ import annotations

from ringtorch.distributed.elastic.utils.api import (
    get_env_variable_or_raise,
    get_socket_with_port,
    macros,
)

__all__ = ["get_env_variable_or_raise", "get_socket_with_port", "macros"]

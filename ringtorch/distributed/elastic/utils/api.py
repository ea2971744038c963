"""``torch.distributed.elastic.utils.api``: small helpers launch scripts import."""

from __future__ import annotations

import os
import socket
from string import Template
from typing import Any

from ringtorch._wire.sockets import listen_tcp


def get_env_variable_or_raise(env_name: str) -> str:
    """The value of ``env_name``.

    Raises:
        ValueError: the variable is not set.
    """
    value = os.environ.get(env_name)
    if value is None:
        raise ValueError(f"Environment variable {env_name} expected, but not set")
    return value


def get_socket_with_port() -> socket.socket:
    """A socket listening on a free loopback port, which it holds until closed (close it just
    before handing the port to whoever binds it).

    Raises:
        RuntimeError: no loopback address could be bound.
    """
    for host in ("127.0.0.1", "::1"):
        try:
            return listen_tcp(host, 0, backlog=0)
        except OSError:
            continue
    raise RuntimeError("Failed to create a socket")


class macros:
    """Placeholders substituted in a worker's arguments: ``${local_rank}``."""

    local_rank = "${local_rank}"

    @staticmethod
    def substitute(args: list[Any], local_rank: str) -> list[Any]:
        """``args`` with ``${local_rank}`` replaced in every string (other values kept)."""
        return [Template(a).safe_substitute(local_rank=local_rank) if isinstance(a, str) else a
                for a in args]


__all__ = ["get_env_variable_or_raise", "get_socket_with_port", "macros"]

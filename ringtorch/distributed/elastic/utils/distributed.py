"""``torch.distributed.elastic.utils.distributed``: a store for a group of agents and free
ports."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from ringtorch.distributed.elastic.utils.api import get_socket_with_port
from ringtorch.distributed.elastic.utils.store import barrier
from ringtorch.store import TCPStore

_TCP_STORE_INIT = "_tcp_store/num_members"

logger = logging.getLogger(__name__)


def get_free_port() -> int:
    """A loopback port that was free a moment ago (another process may take it next)."""
    with get_socket_with_port() as sock:
        return int(sock.getsockname()[1])


def create_c10d_store(is_server: bool, server_addr: str, server_port: int = -1,
                      world_size: int = 1, timeout: float = 60 * 10,
                      wait_for_workers: bool = True, retries: int = 3,
                      use_libuv: bool | None = None) -> Any:
    """A TCPStore served by ``is_server``'s process at ``server_addr:server_port`` (a free
    port, tried ``retries`` times, when -1); with ``wait_for_workers``, returns once
    ``world_size`` members have connected.

    Raises:
        ValueError: ``server_port`` is -1 with ``world_size`` > 1 (the others could not know it).
        RuntimeError: the port stays in use after ``retries`` attempts.
        TimeoutError: the members did not all join within ``timeout`` seconds.
    """
    if use_libuv is not None:
        logger.warning("argument use_libuv is deprecated and ignored")
    if server_port == -1 and world_size > 1:
        raise ValueError(f"server_port must be specified when world_size > 1, got "
                         f"server_port={server_port}, world_size={world_size}")
    attempts = retries if server_port == -1 else 1
    for attempt in range(1, attempts + 1):
        port = server_port if server_port != -1 else get_free_port()
        try:
            store = TCPStore(server_addr, port, world_size=world_size, is_master=is_server,
                             timeout=timedelta(seconds=timeout),
                             wait_for_workers=wait_for_workers)
        except OSError as exc:
            if is_server and attempt < attempts:
                logger.warning("port: %s already in use, attempt: [%s/%s]", port, attempt,
                               attempts)
                continue
            raise RuntimeError(f"on {server_addr}, port: {port} already in use") from exc
        if wait_for_workers:
            try:
                barrier(store, world_size, key_prefix=_TCP_STORE_INIT, barrier_timeout=timeout)
            except RuntimeError as exc:
                raise TimeoutError(
                    f"timed out waiting for all {world_size} members to join") from exc
        return store
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = ["create_c10d_store", "get_free_port", "get_socket_with_port"]


"""Choosing a group's transport, once, alike on every rank (see transports/__init__.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ringtorch import _config
from ringtorch._wire.mesh import PeerMesh, host_identity
from ringtorch._wire.shm_setup import open_domain
from ringtorch.collectives.abort import AbortState
from ringtorch.collectives.reports import ShmWords
from ringtorch.collectives.transports.base import Transport
from ringtorch.collectives.transports.hierarchy import open_hierarchy
from ringtorch.collectives.transports.shm import ShmTransport, attach
from ringtorch.collectives.transports.sockets import SocketTransport

log = logging.getLogger(__name__)


def open_transport(ctx: Any, mesh: PeerMesh | None, overrides: dict[str, str],
                   abort: AbortState,
                   on_failure: Callable[[str], None]) -> tuple[Transport, str]:
    """Choose and set up the group's transport (see the module docstring).

    Returns:
        (transport, why shared memory is not used: "" when it is).

    Raises:
        DistBackendError: a rank did not publish its setup records in time.
    """
    sockets = SocketTransport(mesh, ctx.rank, ctx.size, overrides)
    if ctx.size == 1:
        return sockets, "a group of one rank has no peers"
    deadline = ctx.setup_deadline
    settings = {"chunk": _config.SHM_CHUNK_BYTES.get(), "oneshot": _config.SHM_ONESHOT_BYTES.get()}
    domain, why = open_domain(ctx.store, ctx.rank, ctx.size, ctx.group_name, host_identity(),
                              _config.SHM.get(), _config.SHM_MAX_BYTES.get(), deadline,
                              ShmWords(ctx.group_name), settings)
    if domain is not None:
        return ShmTransport(attach(domain, abort, on_failure), sockets), ""
    hierarchy, hier_why = open_hierarchy(ctx, sockets, abort, on_failure, deadline)
    if hierarchy is not None:
        return hierarchy, ""
    why = hier_why or why
    log.debug("group '%s' uses sockets %s", ctx.group_name, why)
    return sockets, why


__all__ = ["open_transport"]

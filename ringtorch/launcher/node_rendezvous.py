"""How the launchers of a job's nodes agree on each node's place: the rendezvous interface and
the static rendezvous.

Static (``--rdzv-backend static``, the default): every node is told its node rank and the
number of nodes; a round needs no messages at all. Node 0 gives its workers' store the
master port: a free loopback port for a single-node job unless ``--master-port`` names one,
checked free before any worker starts (a busy port is an error naming it, never a hang).
The workers rendezvous among themselves on MASTER_ADDR:MASTER_PORT (their rank 0 hosts the
store), exactly as under torchrun, so a script written for torch.distributed runs unchanged.

The dynamic rendezvous (``--rdzv-backend c10d``) lives in c10d_rendezvous.py.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from ringtorch._wire.sockets import free_port, listen_tcp
from ringtorch.launcher.config import LaunchConfig
from ringtorch.launcher.handlers import RendezvousClosedError, RendezvousError
from ringtorch.launcher.workers import Assignment

DEFAULT_MASTER_PORT = 29500


class NodeRendezvous:
    """One node's side of the rendezvous; the base class is a single-member no-op."""

    def next_round(self, stop: Callable[[], bool]) -> Assignment:
        """Join the next round and return this node's place in it.

        ``stop()`` is polled while waiting; when it turns true the wait ends early with
        ``RendezvousError``.

        Raises:
            RendezvousError: the round could not complete (the message says why).
            RendezvousClosedError: another node closed the job.
        """
        raise NotImplementedError

    def num_nodes_waiting(self) -> int:
        """Nodes waiting to join a new round (they make healthy nodes restart to admit them)."""
        return 0

    def restart_requested(self) -> bool:
        """Another node of the current round left it to restart its workers."""
        return False

    def peer_left(self) -> bool:
        """Another node of the current round left the job gracefully (see :meth:`leave`)."""
        return False

    def closed_reason(self) -> str | None:
        """Why another node closed the job, or None while it is open."""
        return None

    def leave(self) -> bool:
        """Leave the job gracefully, if the others can go on without this node: True when
        they will (they restart their workers in a new round without it), False when the
        job cannot lose this node (the caller then closes it)."""
        return False

    def close(self, reason: str) -> None:
        """Tell the other nodes this node gave up on the job."""

    def finish(self, stop: Callable[[], bool]) -> None:
        """This node's workers succeeded: wait (bounded) until the other nodes are done too."""

    def shutdown(self) -> None:
        """Release the connections and the store this node holds."""


def check_port_free(host: str, port: int) -> None:
    """Raise RendezvousError naming ``host:port`` if something already listens there."""
    try:
        listen_tcp(host, port).close()
    except OSError as exc:
        raise RendezvousError(
            f"--master-port {port}: {exc.strerror or exc}. Pass another --master-port, or "
            f"leave it out on a single node to get a free port") from None


def resolve_host(host: str, flag: str) -> None:
    """Raise RendezvousError when ``host`` has no address (a typo in --master-addr)."""
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise RendezvousError(f"{flag} {host!r} cannot be resolved: {exc}") from None


class StaticRendezvous(NodeRendezvous):
    """Fixed node ranks: the round is computed, not negotiated."""

    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        self.round = 0
        self._port: int | None = None

    def _master_port(self) -> int:
        config = self.config
        if not config.master_port and config.is_single_node:  # None or 0: any free port
            return free_port(config.master_addr)
        port = DEFAULT_MASTER_PORT if config.master_port is None else config.master_port
        if self._port is None and config.node_rank == 0:
            check_port_free(config.master_addr if config.is_single_node else "", port)
        return port

    def next_round(self, stop: Callable[[], bool]) -> Assignment:
        """See base class."""
        config = self.config
        if self._port is None:
            resolve_host(config.master_addr, "--master-addr")
        self._port = self._master_port()
        self.round += 1
        nproc = config.nproc_per_node
        return Assignment(round=self.round, group_rank=config.node_rank,
                          group_world_size=config.max_nodes,
                          base_global_rank=config.node_rank * nproc,
                          world_size=config.max_nodes * nproc,
                          master_addr=config.master_addr, master_port=self._port)


__all__ = [
    "DEFAULT_MASTER_PORT",
    "NodeRendezvous",
    "RendezvousClosedError",
    "RendezvousError",
    "StaticRendezvous",
    "check_port_free",
    "resolve_host",
]

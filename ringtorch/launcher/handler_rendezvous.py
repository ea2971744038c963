"""A custom rendezvous backend (a torch elastic ``RendezvousHandler``) driving ringrun's agent.

The handler decides which nodes form a round and gives each its node rank, the number of
nodes and a store they share; the rest of a round is agreed through that store, as torch's
agent does it:

    ringrun/nproc/{node}      each node's --nproc-per-node (its workers' global ranks follow
                              the lower nodes')
    MASTER_ADDR, MASTER_PORT  where the workers bootstrap their store, unless the handler's
                              RendezvousInfo already says (``RendezvousStoreInfo.build``)
    ringrun/exit/{round}      counter of nodes whose workers succeeded: the exit barrier, so a
                              node hosting the store does not leave before the others are done

Errors of the handler reach the user as ``RendezvousError`` naming the backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ringtorch.launcher.config import LaunchConfig
from ringtorch.launcher.handlers import (
    RendezvousHandler,
    RendezvousParameters,
    RendezvousStoreInfo,
    rendezvous_handler_registry,
)
from ringtorch.launcher.node_rendezvous import NodeRendezvous, RendezvousError
from ringtorch.launcher.workers import Assignment

EXIT_BARRIER_TIMEOUT_S = 300.0
_POLL_S = 0.05


def parameters_for(config: LaunchConfig) -> RendezvousParameters:
    """The RendezvousParameters a custom backend is built from (``--rdzv-conf`` as kwargs)."""
    return RendezvousParameters(backend=config.rdzv_backend, endpoint=config.rdzv_endpoint,
                                run_id=config.run_id, min_nodes=config.min_nodes,
                                max_nodes=config.max_nodes, local_addr=config.local_addr,
                                **config.rdzv_configs)


class HandlerRendezvous(NodeRendezvous):
    """ringrun's node rendezvous on top of a user's RendezvousHandler."""

    def __init__(self, config: LaunchConfig, handler: RendezvousHandler | None = None) -> None:
        self.config = config
        if handler is None:
            try:
                handler = rendezvous_handler_registry.create_handler(parameters_for(config))
            except Exception as exc:  # not registered, or the user's creator failed
                raise RendezvousError(str(exc)) from exc
        self.handler = handler
        self.backend = handler.get_backend()
        self.round = 0
        self.node_rank = -1
        self.nnodes = 0
        self.store = None

    def next_round(self, stop: Callable[[], bool]) -> Assignment:
        """See base class."""
        try:
            info = self.handler.next_rendezvous()
        except RendezvousError:
            raise
        except Exception as exc:  # the user's handler: report it as the rendezvous failing
            raise RendezvousError(f"the rendezvous backend '{self.backend}' failed: "
                                  f"{type(exc).__name__}: {exc}") from exc
        self.round += 1
        self.store, self.node_rank, self.nnodes = info.store, info.rank, info.world_size
        try:
            self.store.set(f"ringrun/nproc/{self.node_rank}", str(self.config.nproc_per_node))
            sizes = [int(self.store.get(f"ringrun/nproc/{i}")) for i in range(self.nnodes)]
            local_addr = self.config.local_addr or (
                "127.0.0.1" if self.config.is_single_node else None)
            bootstrap = info.bootstrap_store_info or RendezvousStoreInfo.build(
                self.node_rank, self.store, local_addr)
        except Exception as exc:
            raise RendezvousError(f"round {self.round} of the rendezvous backend "
                                  f"'{self.backend}': the nodes could not share their sizes "
                                  f"through its store: {exc}") from exc
        return Assignment(round=self.round, group_rank=self.node_rank,
                          group_world_size=self.nnodes,
                          base_global_rank=sum(sizes[:self.node_rank]), world_size=sum(sizes),
                          master_addr=bootstrap.master_addr,
                          master_port=int(bootstrap.master_port))

    def num_nodes_waiting(self) -> int:
        """See base class."""
        try:
            return int(self.handler.num_nodes_waiting())
        except Exception:
            return 0

    def closed_reason(self) -> str | None:
        """See base class."""
        try:
            closed = self.handler.is_closed()
        except Exception as exc:
            return f"the rendezvous backend '{self.backend}' failed: {exc}"
        return f"the rendezvous '{self.handler.get_run_id()}' was closed" if closed else None

    def close(self, reason: str) -> None:
        """See base class."""
        try:
            self.handler.set_closed()
        except Exception:
            pass

    def finish(self, stop: Callable[[], bool]) -> None:
        """See base class: wait (bounded) until every node of the round is done."""
        if self.store is None or self.nnodes <= 1:
            return
        key = f"ringrun/exit/{self.round}"
        deadline = time.monotonic() + EXIT_BARRIER_TIMEOUT_S
        try:
            self.store.add(key, 1)
            while int(self.store.add(key, 0)) < self.nnodes:
                if stop() or time.monotonic() >= deadline:
                    return
                time.sleep(_POLL_S)
        except Exception:
            pass

    def shutdown(self) -> None:
        """See base class."""
        try:
            self.handler.shutdown()
        except Exception:
            pass


__all__ = ["EXIT_BARRIER_TIMEOUT_S", "HandlerRendezvous", "parameters_for"]

"""A custom rendezvous backend, as a user would write one: nodes meet in a shared file.

Registered as ``filerdzv``: in-process with ``rendezvous_handler_registry.register`` (the
``elastic_launch`` tests) or through a ``torchrun.handlers`` entry point whose target is
:func:`creator_factory` (the ringrun tests). ``--rdzv-endpoint`` is the path of the file (a
FileStore); each round waits for ``--nnodes`` MAX nodes, which get ranks in order of arrival.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ringtorch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)
from ringtorch.store import FileStore, PrefixStore

BACKEND = "filerdzv"


class FileRendezvousHandler(RendezvousHandler):
    """Nodes meet through a FileStore at ``params.endpoint``."""

    def __init__(self, params: RendezvousParameters) -> None:
        self.params = params
        timeout = timedelta(seconds=params.get_as_int("timeout", 60) or 60)
        self.store = FileStore(params.endpoint, -1, timeout=timeout)
        self.round = 0

    def get_backend(self) -> str:
        return BACKEND

    def next_rendezvous(self) -> RendezvousInfo:
        store, rank = self.meet()
        return RendezvousInfo(store, rank, self.params.max_nodes,
                              RendezvousStoreInfo.build(rank, store, "127.0.0.1"))

    def meet(self) -> tuple[PrefixStore, int]:
        """Wait for the round's nodes; this round's store and this node's rank."""
        self.round += 1
        prefix = f"{self.params.run_id}/round{self.round}/"
        arrival = self.store.add(prefix + "arrived", 1)
        if arrival == self.params.max_nodes:
            self.store.set(prefix + "complete", "1")
        try:
            self.store.wait([prefix + "complete"])
        except Exception as exc:
            raise RendezvousTimeoutError(f"round {self.round}: only {arrival} node(s) came") \
                from exc
        return PrefixStore(prefix, self.store), arrival - 1

    def is_closed(self) -> bool:
        return self.store.check([f"{self.params.run_id}/closed"])

    def set_closed(self) -> None:
        self.store.set(f"{self.params.run_id}/closed", "1")

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self.params.run_id

    def shutdown(self) -> bool:
        return True


def create_handler(params: RendezvousParameters) -> FileRendezvousHandler:
    """The creator registered under ``filerdzv``."""
    return FileRendezvousHandler(params)


def creator_factory() -> Any:
    """The ``torchrun.handlers`` entry point: returns the creator, as torchrun expects."""
    return create_handler


def all_reduce_ranks() -> tuple[int, int, float]:
    """A worker: join the job's process group and all-reduce rank + 1."""
    import torch

    import ringtorch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    result = (dist.get_rank(), dist.get_world_size(), t.item())
    dist.destroy_process_group()
    return result

"""torch elastic's rendezvous handler API and the registry through which a custom backend
plugs into ringrun and ``elastic_launch``.

A node's launcher needs, each round, its node rank, the number of nodes and a store shared
by the nodes: what ``RendezvousHandler.next_rendezvous()`` returns. ringrun's own backends
(``static``, ``c10d``) are built in; any other ``--rdzv-backend NAME`` is looked up here:

* registered in the process with ``rendezvous_handler_registry.register(NAME, creator)``
  (``ringtorch.distributed.elastic.rendezvous``, as in torch), which is how a program that
  calls ``elastic_launch`` brings its own backend;
* or, for the ``ringrun`` command, found through the ``torchrun.handlers`` entry-point group,
  as torchrun finds out-of-tree handlers: an installed distribution declares
  ``NAME = package.module:function`` and ``function()`` returns the creator.

The names, signatures and messages are torch's (``torch.distributed.elastic.rendezvous.api``);
the store a handler returns is any ringtorch store. Never imports torch.
"""

from __future__ import annotations

import logging
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from ringtorch._errors import DistError
from ringtorch._wire.sockets import free_port

ENTRY_POINT_GROUP = "torchrun.handlers"
BUILTIN_BACKENDS = ("static", "c10d")

log = logging.getLogger(__name__)


class RendezvousError(DistError):
    """The nodes could not agree on a round (unreachable endpoint, timeout, bad input)."""


class RendezvousClosedError(RendezvousError):
    """Another node gave up on the job and closed the rendezvous."""


class RendezvousTimeoutError(RendezvousError):
    """Raised when a rendezvous did not complete on time."""


class RendezvousConnectionError(RendezvousError):
    """Raised when the connection to a rendezvous backend has failed."""


class RendezvousStateError(RendezvousError):
    """Raised when the state of a rendezvous is corrupt."""


class RendezvousGracefulExitError(RendezvousError):
    """Raised when a node was not included in the rendezvous and exits gracefully: a way out
    of the stack, not a failure."""


@dataclass
class RendezvousStoreInfo:
    """Where the workers bootstrap their own store: MASTER_ADDR and MASTER_PORT."""

    MASTER_ADDR_KEY: ClassVar[str] = "MASTER_ADDR"
    MASTER_PORT_KEY: ClassVar[str] = "MASTER_PORT"

    master_addr: str
    master_port: int

    @staticmethod
    def build(rank: int, store: Any, local_addr: str | None,
              server_port: int | None = None) -> RendezvousStoreInfo:
        """Node 0 picks its address and a free port and publishes them in ``store``; every
        node reads them back (so all agree even when node 0's guess is the only one)."""
        if rank == 0:
            addr = local_addr or socket.getfqdn()
            port = server_port or free_port("")
            store.set(RendezvousStoreInfo.MASTER_ADDR_KEY, addr.encode())
            store.set(RendezvousStoreInfo.MASTER_PORT_KEY, str(port).encode())
        addr = store.get(RendezvousStoreInfo.MASTER_ADDR_KEY).decode()
        port = int(store.get(RendezvousStoreInfo.MASTER_PORT_KEY).decode())
        return RendezvousStoreInfo(master_addr=addr, master_port=port)


class RendezvousInfo:
    """What one completed rendezvous gives a node: the store, its rank among the nodes, the
    number of nodes and where the workers bootstrap their store."""

    def __init__(self, store: Any, rank: int, world_size: int,
                 bootstrap_store_info: RendezvousStoreInfo) -> None:
        self._store = store
        self._rank = rank
        self._world_size = world_size
        self._bootstrap_store_info = bootstrap_store_info

    @property
    def store(self) -> Any:
        """The store shared by the nodes' launchers."""
        return self._store

    @property
    def rank(self) -> int:
        """This node's rank among the nodes."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The number of nodes in the round."""
        return self._world_size

    @property
    def bootstrap_store_info(self) -> RendezvousStoreInfo | None:
        """Where the workers bootstrap their own store (MASTER_ADDR/MASTER_PORT)."""
        return self._bootstrap_store_info


class RendezvousHandler(ABC):
    """The rendezvous interface, as torch elastic defines it; subclass it for a custom backend."""

    @abstractmethod
    def get_backend(self) -> str:
        """The name of the rendezvous backend (the name it is registered under)."""

    @property
    def use_agent_store(self) -> bool:
        """Whether the store of :meth:`next_rendezvous` may be shared with the workers.

        ringtorch's workers always bootstrap their own store at MASTER_ADDR:MASTER_PORT, so
        the launcher only reads this to keep torch's interface."""
        return False

    @abstractmethod
    def next_rendezvous(self) -> RendezvousInfo:
        """Block until the rendezvous is complete and this node is in the group.

        Returns:
            A :class:`RendezvousInfo`.

        Raises:
            RendezvousClosedError: the rendezvous is closed.
            RendezvousConnectionError: the connection to the backend failed.
            RendezvousStateError: the rendezvous state is corrupt.
            RendezvousTimeoutError: the rendezvous did not complete on time.
        """

    @abstractmethod
    def is_closed(self) -> bool:
        """Whether the rendezvous was closed (eventually consistent, not a barrier)."""

    @abstractmethod
    def set_closed(self) -> None:
        """Mark the rendezvous as closed: the other nodes stop soon after."""

    @abstractmethod
    def num_nodes_waiting(self) -> int:
        """Nodes that arrived late and wait for the next round."""

    @abstractmethod
    def get_run_id(self) -> str:
        """The run id of the rendezvous (the job's id)."""

    @abstractmethod
    def shutdown(self) -> bool:
        """Close every resource the rendezvous opened."""


class RendezvousParameters:
    """What a :class:`RendezvousHandler` is built from; ``**kwargs`` are the backend's options
    (``--rdzv-conf``)."""

    def __init__(self, backend: str, endpoint: str, run_id: str, min_nodes: int,
                 max_nodes: int, local_addr: str | None = None, **kwargs: Any) -> None:
        if not backend:
            raise ValueError("The rendezvous backend name must be a non-empty string.")
        if min_nodes < 1:
            raise ValueError(f"The minimum number of rendezvous nodes ({min_nodes}) must be "
                             f"greater than zero.")
        if max_nodes < min_nodes:
            raise ValueError(
                f"The maximum number of rendezvous nodes ({max_nodes}) must be greater than or "
                f"equal to the minimum number of rendezvous nodes ({min_nodes}).")
        self.backend = backend
        self.endpoint = endpoint
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.config = kwargs
        self.local_addr = local_addr

    def get(self, key: str, default: Any = None) -> Any:
        """The value for ``key``, or ``default``."""
        return self.config.get(key, default)

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        """The value for ``key`` as a bool (1/0, true/false, yes/no, t/f, y/n)."""
        value = self.get(key, default)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            if value.lower() in ("1", "true", "t", "yes", "y"):
                return True
            if value.lower() in ("0", "false", "f", "no", "n"):
                return False
        raise ValueError(f"The rendezvous configuration option '{key}' does not represent a "
                         f"valid boolean value.")

    def get_as_int(self, key: str, default: int | None = None) -> int | None:
        """The value for ``key`` as an int."""
        value = self.get(key, default)
        if value is None:
            return value
        try:
            return int(value)
        except ValueError as exc:
            raise ValueError(f"The rendezvous configuration option '{key}' does not represent "
                             f"a valid integer value.") from exc


RendezvousHandlerCreator = Callable[[RendezvousParameters], RendezvousHandler]


class RendezvousHandlerRegistry:
    """The rendezvous backends a launcher can use, by name."""

    def __init__(self) -> None:
        self._registry: dict[str, RendezvousHandlerCreator] = {}
        self._entry_points_loaded = False

    def register(self, backend: str, creator: RendezvousHandlerCreator) -> None:
        """Register ``creator`` (called with the RendezvousParameters) under ``backend``.

        Raises:
            ValueError: the name is empty, or already registered with another creator.
        """
        if not backend:
            raise ValueError("The rendezvous backend name must be a non-empty string.")
        current = self._registry.get(backend)
        if current is not None and current != creator:
            raise ValueError(
                f"The rendezvous backend '{backend}' cannot be registered with '{creator}' as it "
                f"is already registered with '{current}'.")
        self._registry[backend] = creator

    def is_registered(self, backend: str) -> bool:
        """Whether ``backend`` has a creator here (after loading the entry points once)."""
        if backend not in self._registry:
            self.load_entry_points()
        return backend in self._registry

    def create_handler(self, params: RendezvousParameters) -> RendezvousHandler:
        """Build the handler ``params.backend`` names.

        Raises:
            ValueError: no such backend is registered.
            RuntimeError: the handler built reports another backend name.
        """
        if not self.is_registered(params.backend):
            raise ValueError(f"The rendezvous backend '{params.backend}' is not registered. Did "
                             f"you forget to call `{self.register.__name__}`?")
        handler = self._registry[params.backend](params)
        if handler.get_backend() != params.backend:
            raise RuntimeError(f"The rendezvous backend '{handler.get_backend()}' does not match "
                               f"the requested backend '{params.backend}'.")
        return handler

    def load_entry_points(self) -> None:
        """Register the handlers installed distributions declare in ``torchrun.handlers``
        (each entry point loads a function that returns the creator), once per process."""
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        from importlib.metadata import entry_points

        for entry in entry_points(group=ENTRY_POINT_GROUP):
            if entry.name in self._registry:
                continue
            try:
                self.register(entry.name, entry.load()())
            except Exception:
                log.warning("could not register the rendezvous handler %r of entry point %r",
                            entry.name, entry.value, exc_info=True)

    def names(self) -> list[str]:
        """The registered backend names, sorted."""
        self.load_entry_points()
        return sorted(self._registry)


rendezvous_handler_registry = RendezvousHandlerRegistry()
"""The process's registry (torch's ``rendezvous_handler_registry``)."""


__all__ = [
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "RendezvousClosedError",
    "RendezvousConnectionError",
    "RendezvousError",
    "RendezvousGracefulExitError",
    "RendezvousHandler",
    "RendezvousHandlerCreator",
    "RendezvousHandlerRegistry",
    "RendezvousInfo",
    "RendezvousParameters",
    "RendezvousStateError",
    "RendezvousStoreInfo",
    "RendezvousTimeoutError",
    "rendezvous_handler_registry",
]

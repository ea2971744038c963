"""``torch.distributed.elastic.rendezvous``: the rendezvous handler API and its registry.

A custom rendezvous backend subclasses :class:`RendezvousHandler` and registers a creator::

    from ringtorch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register("mybackend", lambda params: MyHandler(params))

after which ``elastic_launch`` with ``rdzv_backend="mybackend"`` uses it; ``ringrun
--rdzv-backend mybackend`` finds it through the ``torchrun.handlers`` entry points, as
torchrun does (docs/launching.md). The code is ``ringtorch.launcher.handlers`` (no torch).
"""

from __future__ import annotations

from ringtorch.launcher.handlers import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousHandlerCreator,
    RendezvousHandlerRegistry,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
    rendezvous_handler_registry,
)

__all__ = [
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

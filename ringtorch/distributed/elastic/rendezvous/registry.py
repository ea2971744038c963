"""``torch.distributed.elastic.rendezvous.registry``: build a handler from its parameters.

Custom backends come from ``rendezvous_handler_registry.register`` and from the
``torchrun.handlers`` entry points (loaded on the first look-up of an unknown name). ringrun's
own ``static`` and ``c10d`` backends are built into its agent, not handlers here.
"""

from __future__ import annotations

from ringtorch.launcher.handlers import (
    RendezvousHandler,
    RendezvousParameters,
    rendezvous_handler_registry,
)


def get_rendezvous_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The handler registered under ``params.backend``, built from ``params``.

    Raises:
        ValueError: no backend of that name is registered.
    """
    return rendezvous_handler_registry.create_handler(params)


__all__ = ["get_rendezvous_handler"]

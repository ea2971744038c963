"""``torch.distributed.rendezvous``: init_method URLs -> ``(store, rank, world_size)``.

``rendezvous(url, rank=-1, world_size=-1, **kwargs)`` is a generator whose first value is the
triple; ``register_rendezvous_handler(scheme, handler)`` adds a URL scheme. The code is
``ringtorch.rendezvous`` (``tcp://``, ``file://``, ``env://`` built in; no torch import).
"""

from __future__ import annotations

from ringtorch.rendezvous import register_rendezvous_handler, rendezvous

__all__ = ["register_rendezvous_handler", "rendezvous"]

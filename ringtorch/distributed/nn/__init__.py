"""ringtorch.distributed.nn: torch.distributed.nn's API.

``functional`` holds the collectives autograd can differentiate (their backward is the matching
collective); ``RemoteModule`` (from ``api.remote_module``) runs a module on another RPC worker.
Both are re-exported here, as torch does; so are the names torch's star import of its
functional module brings along (``Function``, ``ReduceOp``, ``group``), which are not API.
"""

from __future__ import annotations

from ringtorch.distributed.nn.api.remote_module import RemoteModule
from ringtorch.distributed.nn.functional import Function as Function
from ringtorch.distributed.nn.functional import ReduceOp as ReduceOp
from ringtorch.distributed.nn.functional import (
    all_gather,
    all_reduce,
    all_to_all,
    all_to_all_single,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    scatter,
)
from ringtorch.distributed.nn.functional import group as group

__all__ = ["RemoteModule", "all_gather", "all_reduce", "all_to_all", "all_to_all_single",
           "broadcast", "gather", "reduce", "reduce_scatter", "scatter"]

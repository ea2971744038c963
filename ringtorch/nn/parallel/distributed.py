"""``ringtorch.nn.parallel.distributed``: torch's ``torch.nn.parallel.distributed`` module path.

Code that imports DDP from the module where torch defines it (``from
torch.nn.parallel.distributed import DistributedDataParallel``, as PyTorch Lightning and many
training scripts do) changes ``torch`` to ``ringtorch`` and gets ringtorch's class, the same
object as ``ringtorch.nn.parallel.DistributedDataParallel``. Only re-exports, of the names of
torch's module that mean something here: its ``__all__``, the names it imports that users
reach through it (Join, ReduceOp, gather, scatter_kwargs) and the helper libraries import from
it (``_find_tensors``, ``_DDPJoinHook``). Mixed precision, the buffer comm hooks and RRef
outputs are not in ringtorch's DDP, so their helpers are not here.
"""

from __future__ import annotations

# Besides __all__, names torch's module has that code imports from it (noqa: re-exports).
from ringtorch.distributed import ReduceOp  # noqa: F401
from ringtorch.distributed.algorithms.join import Join, Joinable, JoinHook  # noqa: F401
from ringtorch.nn.parallel.data_parallel import gather, scatter_kwargs  # noqa: F401
from ringtorch.nn.parallel.ddp import (  # noqa: F401
    DistributedDataParallel,
    _DDPJoinHook,
    _find_tensors,
)

__all__ = ["DistributedDataParallel"]


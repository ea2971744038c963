"""``torch.distributed.optim.optimizer``: the module path of ``DistributedOptimizer``, which
lives in the package (``ringtorch.distributed.optim``)."""

from __future__ import annotations

from ringtorch.distributed.optim import DistributedOptimizer

__all__ = ["DistributedOptimizer"]

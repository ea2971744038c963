"""``ringtorch.nn``: torch.nn's parallel wrappers, DistributedDataParallel over ringtorch.

``from ringtorch.nn.parallel import DistributedDataParallel`` replaces
``from torch.nn.parallel import DistributedDataParallel``; ``ringtorch.nn.DataParallel`` replaces
``torch.nn.DataParallel``. Everything else of ``torch.nn`` is used from torch as it is.
"""

from __future__ import annotations

from ringtorch.nn import parallel
from ringtorch.nn.parallel import DataParallel

__all__ = ["DataParallel", "parallel"]

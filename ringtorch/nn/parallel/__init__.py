"""``ringtorch.nn.parallel``: the names of ``torch.nn.parallel``, with DDP over ringtorch.distributed.

DistributedDataParallel averages gradients with ringtorch's collectives; DataParallel and its
helpers (replicate, scatter, parallel_apply, gather) run replicas in threads of one process.
Join/Joinable/JoinHook are re-exported from ``ringtorch.distributed.algorithms.join`` (torch's
path, where they live); ``comm_hooks`` re-exports torch's default communication hooks from
``ringtorch.distributed.algorithms.ddp_comm_hooks``.
"""

from __future__ import annotations

from ringtorch.distributed.algorithms.join import Join, Joinable, JoinHook
from ringtorch.nn.parallel import comm_hooks
from ringtorch.nn.parallel.data_parallel import (
    DataParallel,
    data_parallel,
    gather,
    parallel_apply,
    replicate,
    scatter,
    scatter_kwargs,
)
from ringtorch.nn.parallel.distributed import DistributedDataParallel
from ringtorch.nn.parallel.reducer import GradBucket

__all__ = [
    "DataParallel",
    "DistributedDataParallel",
    "GradBucket",
    "Join",
    "JoinHook",
    "Joinable",
    "comm_hooks",
    "data_parallel",
    "gather",
    "parallel_apply",
    "replicate",
    "scatter",
    "scatter_kwargs",
]

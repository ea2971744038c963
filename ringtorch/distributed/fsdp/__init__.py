"""FSDP under ringtorch's path: FSDP2's fully_shard and FSDP1's FullyShardedDataParallel.

torch's code, re-exported: the public names of ``torch.distributed.fsdp``, unchanged.
It runs on ringtorch's engine on groups of either door (``ringtorch.distributed.init_process_group``,
whose groups are torch's too, or ``torch.distributed.init_process_group("ringtorch")``);
docs/modern-stack.md. This path imports torch's module only, never the engine.

One name is ringtorch's: ``FullyShardedDataParallel`` is a subclass of torch's whose
FULL_STATE_DICT with ``offload_to_cpu=True`` works on CPU modules (_cpu_state_dict.py).
"""

from __future__ import annotations

import torch.distributed.fsdp as _torchs

from ringtorch.distributed._torch_names import reexport

__all__ = reexport(_torchs, globals())

# ringtorch's one change: a full state dict offloaded to the CPU works on CPU (_cpu_state_dict.py)
from ringtorch.distributed.fsdp._cpu_state_dict import (
    FullyShardedDataParallel as FullyShardedDataParallel,
)

"""DTensor (distribute_tensor, placements, factories) under ringtorch's path.

torch's code, re-exported: the public names of ``torch.distributed.tensor``, unchanged.
It runs on ringtorch's engine on groups of either door (``ringtorch.distributed.init_process_group``,
whose groups are torch's too, or ``torch.distributed.init_process_group("ringtorch")``);
docs/modern-stack.md. This path imports torch's module only, never the engine.

ringtorch adds one thing, off until called: ``enable_replicate_fallback()`` runs operators
that have no DTensor sharding strategy (by default the CPU attention kernel) replicated and
re-shards their results (_replicate_fallback.py).
"""

from __future__ import annotations

import torch.distributed.tensor as _torchs

from ringtorch.distributed._torch_names import reexport

__all__ = reexport(_torchs, globals())

# ringtorch's addition: operators without a sharding strategy, run replicated (opt-in)
from ringtorch.distributed.tensor._replicate_fallback import (
    disable_replicate_fallback,
    enable_replicate_fallback,
)

__all__ += ["disable_replicate_fallback", "enable_replicate_fallback"]

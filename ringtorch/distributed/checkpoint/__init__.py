"""Distributed checkpointing (save, load, async_save, planners, storage) under ringtorch's path.

torch's code, re-exported: the public names of ``torch.distributed.checkpoint``, unchanged.
It runs on ringtorch's engine on groups of either door (``ringtorch.distributed.init_process_group``,
whose groups are torch's too, or ``torch.distributed.init_process_group("ringtorch")``);
docs/modern-stack.md. This path imports torch's module only, never the engine.

The submodules ``state_dict``, ``format_utils`` and ``stateful`` are ringtorch's paths too;
torch's other submodules are reached under torch's path.
"""

from __future__ import annotations

import torch.distributed.checkpoint as _torchs

from ringtorch.distributed._torch_names import reexport

__all__ = reexport(_torchs, globals())

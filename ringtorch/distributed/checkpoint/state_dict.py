"""get_state_dict/set_state_dict and friends under ringtorch's path.

torch's code, re-exported: the public names of ``torch.distributed.checkpoint.state_dict``, unchanged.
It runs on ringtorch's engine on groups of either door (``ringtorch.distributed.init_process_group``,
whose groups are torch's too, or ``torch.distributed.init_process_group("ringtorch")``);
docs/modern-stack.md. This path imports torch's module only, never the engine.
"""

from __future__ import annotations

import torch.distributed.checkpoint.state_dict as _torchs

from ringtorch.distributed._torch_names import reexport

__all__ = reexport(_torchs, globals())

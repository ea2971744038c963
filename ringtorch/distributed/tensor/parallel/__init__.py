"""Tensor parallelism (parallelize_module and its styles) under ringtorch's path.

torch's code, re-exported: the public names of ``torch.distributed.tensor.parallel``, unchanged.
It runs on ringtorch's engine on groups of either door (``ringtorch.distributed.init_process_group``,
whose groups are torch's too, or ``torch.distributed.init_process_group("ringtorch")``);
docs/modern-stack.md. This path imports torch's module only, never the engine.
"""

from __future__ import annotations

import torch.distributed.tensor.parallel as _torchs

from ringtorch.distributed._torch_names import reexport

__all__ = reexport(_torchs, globals())

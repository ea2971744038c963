"""DeviceMesh and init_device_mesh under ringtorch's path.

torch's code, re-exported: the public names of ``torch.distributed.device_mesh``, unchanged.
It runs on ringtorch's engine when its groups are made through backend "ringtorch"
(``torch.distributed.init_process_group("ringtorch")``, or ``init_device_mesh("cpu", ...)``
after it); docs/modern-stack.md. This path imports torch's module only, never the engine.
"""

from __future__ import annotations

import torch.distributed.device_mesh as _torchs

from ringtorch.distributed._torch_names import reexport

__all__ = reexport(_torchs, globals())

"""DeviceMesh and init_device_mesh under ringtorch's path.

torch's code, re-exported: the public names of ``torch.distributed.device_mesh``. It runs on
ringtorch's engine on groups of either door: ``ringtorch.distributed.init_process_group(...)``
(whose groups are torch's world's too) or ``torch.distributed.init_process_group("ringtorch")``;
docs/modern-stack.md. This path imports torch's module only, never the engine.

One difference: where torch's ``init_device_mesh`` finds no default group it starts one of
its own (torch's ``init_process_group()``: gloo over ``env://``, a second rendezvous beside
ringtorch's, or a store port still held); under this path it raises an error that says to
initialize through ``ringtorch.distributed`` first.
"""

from __future__ import annotations

import functools
from typing import Any

import torch.distributed as _dist
import torch.distributed.device_mesh as _torchs

from ringtorch.distributed._torch_names import reexport

__all__ = reexport(_torchs, globals())


@functools.wraps(_torchs.init_device_mesh)
def init_device_mesh(device_type: str, mesh_shape: tuple[int, ...], **kwargs: Any) -> Any:
    """torch's ``init_device_mesh``, on the default group that must exist already.

    Raises:
        RuntimeError: no default process group (none was made, or
            ``destroy_process_group()`` destroyed it).
    """
    if not _dist.is_initialized():
        raise RuntimeError(
            "init_device_mesh needs a default process group: call "
            "ringtorch.distributed.init_process_group() first (after destroy_process_group(), "
            "call it again, and make meshes, DTensors and sharded models anew)")
    return _torchs.init_device_mesh(device_type, mesh_shape, **kwargs)

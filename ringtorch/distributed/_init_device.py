"""The device a new default group binds to: ``init_process_group``'s ``device_id`` checks.

torch binds a group to ``device_id`` (its communicator is made at once). ringtorch accepts a
CUDA device only where backend "nccl" is open (``ringtorch/_device/confirmed.py``), and a
CPU device always; anything else is refused with a message naming the device.
"""

from __future__ import annotations

from typing import Any

from ringtorch.collectives.backends import registry
from ringtorch.distributed._backend import Backend, BackendConfig


def check_device_id(device_id: Any) -> Any:
    """``device_id`` as a torch.device (an int is a CUDA index, as torch takes it).

    A CUDA device is accepted where backend "nccl" is available (torch: the bound device,
    whose communicator is made at once); otherwise only a CPU device is.
    """
    if device_id is None:
        return None
    if registry.is_available(Backend.NCCL):
        import torch

        if isinstance(device_id, int) and not isinstance(device_id, bool):
            device_id = torch.device("cuda", device_id)
        if getattr(device_id, "type", None) == "cuda":
            if device_id.index is None:
                raise ValueError("Please use a device_id with index.")
            return device_id
    kind = getattr(device_id, "type", None)
    if kind != "cpu":
        raise ValueError(f"device_id {device_id} is not available: ringtorch runs collectives "
                         f"on CPU tensors (an accelerator backend is not available yet)")
    return device_id


def runs_nccl(backend_config: str) -> bool:
    """Whether a group of this backend map runs its CUDA tensors on backend "nccl" (and that
    backend is available here)."""
    return (BackendConfig(backend_config).get_device_backend_map().get("cuda") == Backend.NCCL
            and registry.is_available(Backend.NCCL))

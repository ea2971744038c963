"""The device seam: every CUDA call ringtorch makes goes through a ``DeviceRuntime``.

``runtime()`` picks the process's runtime: ``CudaRuntime`` (over ``torch.cuda``) where torch
sees a GPU, else ``SimRuntime`` (streams run by threads over CPU memory), or what
``RINGTORCH_DEVICE_RUNTIME`` says. ``nccl_lib`` binds the NCCL library; ``confirmed`` names the
recorded GPU run that confirmed each device feature (none yet: users see no GPU behaviour).
A low layer: imports torch, ``_config`` and ``_errors`` only. Importing it never initialises
CUDA.
"""

from __future__ import annotations

import threading

from ringtorch import _config
from ringtorch._device.api import DeviceEvent, DeviceRuntime, DeviceStream, IpcBuffer


class _State:
    """The runtimes made in this process, one per kind (the subsystem's one state object)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.runtimes: dict[str, DeviceRuntime] = {}


_state = _State()


def runtime() -> DeviceRuntime:
    """This process's device runtime (see the module docstring).

    Raises:
        RuntimeError: ``RINGTORCH_DEVICE_RUNTIME=cuda`` where torch sees no usable GPU.
    """
    import torch

    choice = _config.DEVICE_RUNTIME.get()
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "sim"
    elif choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(
            "RINGTORCH_DEVICE_RUNTIME=cuda, but torch sees no usable CUDA device "
            f"(torch {torch.__version__}, built with CUDA: {torch.backends.cuda.is_built()})")
    with _state.lock:
        made = _state.runtimes.get(choice)
        if made is None:
            if choice == "cuda":
                from ringtorch._device.cuda import CudaRuntime

                made = CudaRuntime()
            else:
                from ringtorch._device.sim import SimRuntime

                made = SimRuntime()
            _state.runtimes[choice] = made
        return made


def made(name: str) -> DeviceRuntime | None:
    """The runtime ``name`` ("cuda" or "sim") if this process has made it, else None; never
    makes one (so never initialises CUDA). Lock-free (a dict read): every collective asks."""
    return _state.runtimes.get(name)


__all__ = ["DeviceEvent", "DeviceRuntime", "DeviceStream", "IpcBuffer", "made", "runtime"]

"""Device memory for modules and buffers, whichever runtime holds it: what DDP, DataParallel
and RPC need to treat a simulated device tensor as they treat a CUDA one.

On CUDA a device tensor is a CUDA tensor and torch ops on it are ordered by the current
stream by torch itself. On the simulated runtime a device tensor is CPU memory made by
``SimRuntime.empty``, and torch ops on it run on the host at once: ``to_device`` moves a
module's parameters and buffers (or a tensor) there, standing in for ``module.to("cuda:N")``;
``fence`` makes the host wait for the current stream before it reads device memory with a
torch op (on CUDA the stream orders that op; nothing to do). The feature ``gpu_training``
(DDP and DataParallel on device modules, RPC device maps) is open where ``training_opened``.

Rule kept: nothing here initialises CUDA in a process that holds no CUDA tensor.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ringtorch import _config, _device
from ringtorch._device.api import DeviceRuntime
from ringtorch._device.confirmed import confirmed

FEATURE = "gpu_training"
CLOSED = ("{what} is not available in this build of ringtorch: it has not been confirmed on "
          "a GPU yet (docs/gpu.md lists the recorded GPU runs); RINGTORCH_DEVICE_UNCONFIRMED=1 "
          "opens it for testing")


def training_opened() -> bool:
    """Whether DDP/DataParallel on device modules and RPC device maps are open."""
    return bool(_config.DEVICE_UNCONFIRMED.get()) or confirmed(FEATURE)


def runtime_of(tensors: Iterable[Any]) -> DeviceRuntime | None:
    """The runtime of the first device tensor among ``tensors`` (a CUDA tensor, or memory
    of the simulated runtime where this process made one), else None."""
    sim = _device.made("sim")
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        if t.is_cuda:
            return _device.runtime()
        if sim is not None and sim.is_device(t):
            return sim
    return None


def is_sim(rt: DeviceRuntime | None) -> bool:
    return rt is not None and rt.name == "sim"


def _tensor_to(rt: DeviceRuntime, t: torch.Tensor, index: int) -> torch.Tensor:
    if rt.name == "cuda":
        return t.to(rt.device(index))
    out = rt.empty(tuple(t.shape), t.dtype, index)
    out.copy_(t.detach())  # host memory on both sides: no stream work to order
    return out


def to_device(obj: Any, index: int, rt: DeviceRuntime | None = None) -> Any:
    """``obj`` (a module, in place, or a tensor) on GPU ``index`` of ``rt`` (default: this
    process's runtime): ``.to("cuda:N")`` on CUDA; parameters and buffers moved into device
    memory on the simulator (``param.data`` replaced, the Parameter objects kept)."""
    rt = rt or _device.runtime()
    if isinstance(obj, torch.Tensor):
        return _tensor_to(rt, obj, index)
    if rt.name == "cuda":
        return obj.to(rt.device(index))
    with torch.no_grad():
        for param in obj.parameters():
            param.data = _tensor_to(rt, param.data, index)
        for module in obj.modules():
            for name, buf in module.named_buffers(recurse=False):
                if buf is not None:
                    module._buffers[name] = _tensor_to(rt, buf, index)
    return obj


def zeros(rt: DeviceRuntime, numel: int, dtype: torch.dtype, index: int) -> torch.Tensor:
    """A zero-filled 1-D device tensor on GPU ``index``."""
    if rt.name == "cuda":
        return torch.zeros(numel, dtype=dtype, device=rt.device(index))
    return rt.empty((numel,), dtype, index).zero_()


def zeros_like(t: torch.Tensor) -> torch.Tensor:
    """``torch.zeros_like(t)``, in device memory where ``t`` is (the simulator's too)."""
    rt = runtime_of((t,))
    if not is_sim(rt):
        return torch.zeros_like(t)
    return rt.empty(tuple(t.shape), t.dtype, 0).zero_()  # type: ignore[union-attr]


def fence(rt: DeviceRuntime | None, index: int = 0) -> None:
    """Before the host reads device memory with torch ops: on the simulator, wait for the
    calling thread's current stream (on CUDA the op itself is ordered by it)."""
    if is_sim(rt):
        rt.current_stream(index).synchronize()  # type: ignore[union-attr]

"""The device seam over ``torch.cuda``: thin, and only with APIs torch has had since 2.0.

Streams and events are torch's own objects (they satisfy the contract of ``api.py`` as they
are). IPC export and open go through ``torch.multiprocessing.reductions``, the path torch's
own multiprocessing uses (it keeps the exporter's allocation alive with its ref-counter file).
Rule kept: nothing here initialises CUDA at import; the first call does.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from ringtorch._device.api import DeviceEvent, DeviceStream, IpcBuffer

# torch.cuda._sleep spins for a number of GPU clock cycles; about 1.5 GHz (an H100 boosts to
# ~2 GHz, so ``busy`` errs on the short side, which an ordering check tolerates).
_CYCLES_PER_SECOND = 1.5e9


class CudaRuntime:
    """:class:`~ringtorch._device.api.DeviceRuntime` on real GPUs."""

    name = "cuda"

    def device(self, index: int) -> torch.device:
        return torch.device("cuda", index)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: int) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.device(device))

    def is_device(self, tensor: torch.Tensor) -> bool:
        return bool(tensor.is_cuda)

    def device_index(self, tensor: torch.Tensor) -> int:
        return int(tensor.get_device())

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def new_stream(self, device: int) -> DeviceStream:
        return torch.cuda.Stream(device=self.device(device))

    def current_stream(self, device: int) -> DeviceStream:
        return torch.cuda.current_stream(self.device(device))

    def use_stream(self, stream: DeviceStream) -> AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def new_event(self, interprocess: bool = False) -> DeviceEvent:
        return torch.cuda.Event(interprocess=interprocess)

    def open_event(self, handle: bytes, device: int) -> DeviceEvent:
        return torch.cuda.Event.from_ipc_handle(self.device(device), handle)

    def launch(self, stream: DeviceStream, fn: Callable[[], object]) -> None:
        with torch.cuda.stream(stream):
            fn()

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: DeviceStream) -> None:
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)

    def busy(self, stream: DeviceStream, seconds: float) -> None:
        with torch.cuda.stream(stream):
            torch.cuda._sleep(int(seconds * _CYCLES_PER_SECOND))

    def synchronize(self, device: int) -> None:
        torch.cuda.synchronize(self.device(device))

    def export(self, tensor: torch.Tensor) -> IpcBuffer:
        from torch.multiprocessing.reductions import reduce_tensor

        rebuild, args = reduce_tensor(tensor)
        return IpcBuffer("cuda", (rebuild, args))

    def open(self, buffer: IpcBuffer) -> torch.Tensor:
        if buffer.runtime != self.name:
            raise ValueError(f"cannot open a {buffer.runtime!r} device buffer with the cuda runtime")
        rebuild, args = buffer.payload
        tensor: torch.Tensor = rebuild(*args)
        return tensor

"""The device seam's contract: what ringtorch asks of a GPU runtime, and nothing more.

Every CUDA call ringtorch makes goes through a :class:`DeviceRuntime`: ``CudaRuntime`` over
``torch.cuda`` and ``SimRuntime`` for CPU-only torch (a stream is a FIFO run by a thread). The
docstrings below are the contract both keep; ``tests/unit/test_device_runtime.py`` checks it
on each (``cuda`` where a GPU is at hand). The contract is the subset of ``torch.cuda``'s
``Stream`` and ``Event`` methods that staging collectives through pinned host memory and an
IPC exchange between ranks on one host need, under torch's own method names, so that a
``torch.cuda.Stream`` or ``torch.cuda.Event`` is itself a valid :class:`DeviceStream` or
:class:`DeviceEvent`.

Rule kept: device work ringtorch issues is enqueued with :meth:`DeviceRuntime.launch` or
:meth:`DeviceRuntime.copy` on an explicit stream, never run as a bare torch op, so the
simulator orders it exactly as a GPU would.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class DeviceEvent(Protocol):
    """A marker in a stream's work (``torch.cuda.Event``'s semantics).

    Recording captures the work queued on the stream *at the time of the call*; a later
    record replaces it. ``query``, ``synchronize`` and ``wait`` use the captured state at the
    time of *their* call: on an event never recorded they see an empty set of work (``query``
    is True, ``synchronize`` returns at once, ``wait`` adds nothing to the stream). Hence a
    peer of an interprocess event must learn by a host-side handshake that the owner has
    recorded before it waits; a wait placed earlier is silently a no-op.
    """

    def record(self, stream: Any = None) -> None:
        """Capture the work queued so far on ``stream`` (default: the current stream)."""

    def query(self) -> bool:
        """True when the captured work has completed (or nothing was ever recorded)."""

    def synchronize(self) -> None:
        """Block the host until the captured work has completed."""

    def wait(self, stream: Any = None) -> None:
        """Make future work on ``stream`` (default: current) wait for the captured work,
        without blocking the host."""

    def ipc_handle(self) -> bytes:
        """Bytes a process on the same host opens with :meth:`DeviceRuntime.open_event`.
        Only events created with ``interprocess=True`` have one; only the creator records."""


class DeviceStream(Protocol):
    """An in-order queue of device work (``torch.cuda.Stream``'s semantics): work enqueued
    on one stream runs in the order it was enqueued; different streams are unordered unless
    joined by an event."""

    def wait_event(self, event: Any) -> None:
        """Future work on this stream waits for ``event``'s captured work (as ``event.wait``)."""

    def wait_stream(self, stream: Any) -> None:
        """Future work on this stream waits for the work queued on ``stream`` so far."""

    def synchronize(self) -> None:
        """Block the host until all work queued on this stream so far has completed."""

    def query(self) -> bool:
        """True when all work queued on this stream has completed."""


@dataclass(frozen=True)
class IpcBuffer:
    """A device buffer exported for processes on the same host (picklable): ``runtime`` is
    the exporting runtime's name, ``payload`` what that runtime needs to open it. The exporter
    keeps the buffer alive for as long as any peer may use it."""

    runtime: str
    payload: tuple[Any, ...]


class DeviceRuntime(Protocol):
    """Streams, events, pinned host memory, copies and IPC on one host's devices."""

    #: "cuda" or "sim"
    name: str

    def device(self, index: int) -> torch.device:
        """The torch device that holds this runtime's device memory of GPU ``index`` (the
        simulator's device memory is CPU memory)."""

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: int) -> torch.Tensor:
        """Uninitialised device memory on GPU ``device`` that :meth:`export` can share."""

    def is_device(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` is this runtime's device memory (a CUDA tensor; in the simulator
        a view of memory made by :meth:`empty`). Never initialises CUDA."""

    def device_index(self, tensor: torch.Tensor) -> int:
        """The GPU index of a device tensor (one for which :meth:`is_device` is True)."""

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Uninitialised page-locked host memory (the source/target of async copies)."""

    def new_stream(self, device: int) -> DeviceStream:
        """A new stream on GPU ``device``."""

    def current_stream(self, device: int) -> DeviceStream:
        """The calling thread's current stream on GPU ``device`` (its default stream unless
        inside :meth:`use_stream`)."""

    def use_stream(self, stream: DeviceStream) -> AbstractContextManager[Any]:
        """A context in which ``stream`` is the calling thread's current stream."""

    def new_event(self, interprocess: bool = False) -> DeviceEvent:
        """A new event, never recorded; ``interprocess=True`` gives it an IPC handle."""

    def open_event(self, handle: bytes, device: int) -> DeviceEvent:
        """Open, in another process of this host, an event by its :meth:`DeviceEvent.ipc_handle`."""

    def launch(self, stream: DeviceStream, fn: Callable[[], object]) -> None:
        """Enqueue ``fn`` (torch ops on device tensors) on ``stream``; returns before it runs.
        Whatever ``fn`` reads or writes must stay alive until an event recorded after it
        completes."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: DeviceStream) -> None:
        """Enqueue ``dst.copy_(src)`` (host<->device, device<->device) on ``stream``; returns
        before it runs. Host memory in an async copy must be pinned and left untouched until
        an event recorded after the copy completes."""

    def busy(self, stream: DeviceStream, seconds: float) -> None:
        """Enqueue work that keeps ``stream`` busy for about ``seconds`` (checks use it to
        make ordering mistakes visible)."""

    def synchronize(self, device: int) -> None:
        """Block the host until every stream of GPU ``device`` has drained."""

    def export(self, tensor: torch.Tensor) -> IpcBuffer:
        """Share a device tensor made by :meth:`empty` with the other processes of this host.
        The caller keeps ``tensor`` alive while peers use it."""

    def open(self, buffer: IpcBuffer) -> torch.Tensor:
        """A tensor over a peer's exported device memory (same shape, dtype and contents as
        the peer's). Opening an export in the process that made it is not supported."""

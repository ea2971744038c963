"""The device seam simulated on CPU-only torch, faithful where ordering bugs hide.

Device memory is CPU memory (in named shared-memory files, so it can be exported to another
process); a stream is a FIFO of closures run by its own worker thread, each op delayed by an
injectable ``delay(kind)`` so that a missing wait shows as a wrong result; an event is a pair
of generation counters (recorded, completed). As on CUDA, ``record`` captures a generation at
the time of the call and ``query``/``synchronize``/``wait`` use the generation recorded at the
time of *their* call: a wait placed before the first record is a no-op, even across processes
(an interprocess event's counters live in shared memory). Rule kept: nothing here runs device
work on the caller's thread, except what CUDA also runs there.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch

from ringtorch._device import _sim_shm
from ringtorch._device.api import IpcBuffer

_EVENT_PREFIX = b"ringtorch-sim-event:"
_POLL_S = 0.0002  # how often a host-side wait on shared counters looks again


class _Fifo:
    """A stream's queue and its worker thread (kept apart from SimStream so the thread does
    not keep the stream alive: the stream's finalizer stops it)."""

    def __init__(self, name: str, delay: Callable[[str], float] | None) -> None:
        self.cond = threading.Condition()
        self.ops: deque[tuple[int, str, Callable[[], object]] | None] = deque()
        self.enqueued = 0
        self.completed = 0
        self.error: BaseException | None = None
        self.delay = delay
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, kind: str, fn: Callable[[], object]) -> int:
        with self.cond:
            self.enqueued += 1
            self.ops.append((self.enqueued, kind, fn))
            self.cond.notify_all()
            return self.enqueued

    def stop(self, join_s: float = 0.0) -> None:
        with self.cond:
            self.ops.append(None)
            self.cond.notify_all()
        if join_s > 0 and self.thread is not threading.current_thread():
            self.thread.join(join_s)

    def wait_for(self, seq: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.completed >= seq)

    def _run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: bool(self.ops))
                op = self.ops.popleft()
            if op is None:
                return
            seq, kind, fn = op
            try:
                if self.delay is not None:
                    seconds = self.delay(kind)
                    if seconds > 0:
                        time.sleep(seconds)
                fn()
            except BaseException as exc:  # a failed kernel poisons the stream, as on CUDA
                if self.error is None:
                    self.error = exc
            # an idle worker holds nothing: what the op read or wrote may be freed now
            op = fn = None  # type: ignore[assignment]
            with self.cond:
                self.completed = seq
                self.cond.notify_all()


class SimStream:
    """A simulated stream (see the module docstring)."""

    def __init__(self, runtime: SimRuntime, device: int) -> None:
        self.runtime = runtime
        self.device = device
        self._fifo = _Fifo(f"sim-stream-{device}", runtime.delay)
        runtime._fifos.add(self._fifo)
        weakref.finalize(self, self._fifo.stop)

    def submit(self, kind: str, fn: Callable[[], object]) -> int:
        return self._fifo.submit(kind, fn)

    def wait_event(self, event: Any) -> None:
        counters, target = event._counters, event._recorded_now()
        if target == 0:  # never recorded: an empty set of work, as on CUDA
            return
        self.submit("wait", lambda: _wait_counter(counters, target))

    def wait_stream(self, stream: Any) -> None:
        event = SimEvent(self.runtime)
        event.record(stream)
        self.wait_event(event)

    def synchronize(self) -> None:
        self._fifo.wait_for(self._fifo.enqueued)
        if self._fifo.error is not None:
            raise RuntimeError(f"simulated device work failed on this stream: "
                               f"{self._fifo.error!r}") from self._fifo.error

    def query(self) -> bool:
        return self._fifo.completed >= self._fifo.enqueued


def _wait_counter(counters: memoryview, target: int) -> None:
    while counters[1] < target:
        time.sleep(_POLL_S)


class SimEvent:
    """A simulated event: ``counters[0]`` the last generation recorded, ``counters[1]`` the
    last one completed (in shared memory when interprocess)."""

    def __init__(self, runtime: SimRuntime, interprocess: bool = False,
                 opened: str | None = None) -> None:
        self.runtime = runtime
        self._path: str | None = None
        if opened is not None:
            self._map: Any = _sim_shm.attach(opened)
        elif interprocess:
            self._path, self._map = _sim_shm.create(16, "event")
            weakref.finalize(self, _sim_shm.unlink, self._path)
        else:
            self._map = bytearray(16)
        self._counters = memoryview(self._map).cast("q")

    def _recorded_now(self) -> int:
        return int(self._counters[0])

    def record(self, stream: Any = None) -> None:
        stream = stream if stream is not None else self.runtime.current_stream(0)
        gen = self._counters[0] + 1
        self._counters[0] = gen
        counters = self._counters

        def mark() -> None:
            if counters[1] < gen:
                counters[1] = gen

        stream.submit("record", mark)

    def query(self) -> bool:
        return bool(self._counters[1] >= self._counters[0])

    def synchronize(self) -> None:
        _wait_counter(self._counters, self._recorded_now())

    def wait(self, stream: Any = None) -> None:
        stream = stream if stream is not None else self.runtime.current_stream(0)
        stream.wait_event(self)

    def ipc_handle(self) -> bytes:
        if self._path is None:
            raise RuntimeError("only an event created with interprocess=True has an IPC handle")
        return _EVENT_PREFIX + self._path.encode()


def _stop_all(fifos: weakref.WeakSet[_Fifo]) -> None:
    for fifo in list(fifos):
        fifo.stop(join_s=5.0)


class SimRuntime:
    """:class:`~ringtorch._device.api.DeviceRuntime` for CPU-only torch.

    ``delay(kind)`` gives the seconds each stream op waits before it runs (``kind``: launch,
    copy, record, wait, busy); tests use it to make unordered work finish out of order.
    """

    name = "sim"

    def __init__(self, delay: Callable[[str], float] | None = None) -> None:
        self.delay = delay
        self._local = threading.local()
        self._lock = threading.Lock()
        self._defaults: dict[int, SimStream] = {}
        self._streams: weakref.WeakSet[SimStream] = weakref.WeakSet()
        self._segments: dict[int, str] = {}  # storage data_ptr -> segment of empty()
        # the workers are stopped and joined at exit: a worker thread still alive in torch
        # while the interpreter tears torch down aborts the process
        self._fifos: weakref.WeakSet[_Fifo] = weakref.WeakSet()
        weakref.finalize(self, _stop_all, self._fifos)

    def device(self, index: int) -> torch.device:
        return torch.device("cpu")

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: int) -> torch.Tensor:
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        path, mapping = _sim_shm.create(nbytes, "mem")
        flat = torch.frombuffer(mapping, dtype=torch.uint8)
        tensor = flat[:nbytes].view(dtype).reshape(shape)
        key = tensor.untyped_storage().data_ptr()
        with self._lock:
            self._segments[key] = path
        # the mapping lives as long as any view of the storage does; then the name goes
        weakref.finalize(mapping, self._forget, key, path)
        return tensor

    def _forget(self, key: int, path: str) -> None:
        with self._lock:
            self._segments.pop(key, None)
        _sim_shm.unlink(path)

    def is_device(self, tensor: torch.Tensor) -> bool:
        if not self._segments or tensor.layout is not torch.strided:
            return False  # no device memory made yet (or no storage): spares a lookup
        return tensor.untyped_storage().data_ptr() in self._segments

    def device_index(self, tensor: torch.Tensor) -> int:
        return 0  # the simulator has one device

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def new_stream(self, device: int) -> SimStream:
        stream = SimStream(self, device)
        self._streams.add(stream)
        return stream

    def _default(self, device: int) -> SimStream:
        with self._lock:
            stream = self._defaults.get(device)
        if stream is None:
            stream = self.new_stream(device)
            with self._lock:
                stream = self._defaults.setdefault(device, stream)
        return stream

    def current_stream(self, device: int) -> SimStream:
        stack: list[SimStream] = getattr(self._local, "stack", [])
        for stream in reversed(stack):
            if stream.device == device:
                return stream
        return self._default(device)

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        @contextmanager
        def using() -> Iterator[Any]:
            stack = self._local.__dict__.setdefault("stack", [])
            stack.append(stream)
            try:
                yield stream
            finally:
                stack.pop()

        return using()

    def new_event(self, interprocess: bool = False) -> SimEvent:
        return SimEvent(self, interprocess=interprocess)

    def open_event(self, handle: bytes, device: int) -> SimEvent:
        if not handle.startswith(_EVENT_PREFIX):
            raise ValueError("not an IPC handle of a simulated interprocess event")
        return SimEvent(self, opened=handle[len(_EVENT_PREFIX):].decode())

    def launch(self, stream: Any, fn: Callable[[], object]) -> None:
        stream.submit("launch", fn)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: Any) -> None:
        stream.submit("copy", lambda: dst.copy_(src))

    def busy(self, stream: Any, seconds: float) -> None:
        stream.submit("busy", lambda: time.sleep(seconds))

    def synchronize(self, device: int) -> None:
        for stream in list(self._streams):
            if stream.device == device:
                stream.synchronize()

    def export(self, tensor: torch.Tensor) -> IpcBuffer:
        storage = tensor.untyped_storage()
        with self._lock:
            path = self._segments.get(storage.data_ptr())
        if path is None:
            raise ValueError("only a tensor made by this runtime's empty() can be exported")
        return IpcBuffer("sim", (path, tensor.storage_offset(), tuple(tensor.shape),
                                 tuple(tensor.stride()), str(tensor.dtype).split(".")[-1]))

    def open(self, buffer: IpcBuffer) -> torch.Tensor:
        if buffer.runtime != self.name:
            raise ValueError(f"cannot open a {buffer.runtime!r} device buffer with the sim runtime")
        path, offset, shape, stride, dtype_name = buffer.payload
        dtype = getattr(torch, dtype_name)
        flat = torch.frombuffer(_sim_shm.attach(path), dtype=torch.uint8)
        itemsize = torch.empty((), dtype=dtype).element_size()
        whole = flat[: flat.numel() // itemsize * itemsize].view(dtype)
        return whole.as_strided(shape, stride, offset)

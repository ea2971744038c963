"""Collectives and point-to-point operations on device tensors, staged through pinned host
memory in the order of the caller's current stream (as torch's gloo does with CUDA tensors).

An entry point of the facade marked with :func:`staged` names the parameters it reads and
writes, and starts with ``if (rt := device_runtime(...)) is not None: return staged_call(rt,
fn, locals())``. When one of them holds a device tensor (a CUDA tensor; in the simulator a
tensor made by ``SimRuntime.empty``) and the feature ``cuda_tensors`` is open
(``_device.confirmed``, or ``RINGTORCH_DEVICE_UNCONFIRMED=1`` for tests and the GPU check),
the call runs as (``staged_call`` runs the entry point itself on the host buffers):

1. an event recorded on the caller's current stream; a staging stream (one per device) waits
   on it, so work already queued on the current stream is included;
2. each device tensor read is copied device-to-host into a pinned buffer on the staging stream;
   the host waits for those copies only (they come after the caller's queued work);
3. the CPU operation runs on the host buffers (the unchanged entry point);
4. each device tensor written is copied back host-to-device on the staging stream, and the
   current stream is made to wait for the copy-back: a synchronous call returns with that
   wait in place; an asynchronous one returns a Work whose ``wait()`` places it on the waiting
   thread's current stream without blocking the host on the copy-back (it blocks until the
   host operation is done, as torch's does). The copy-back is enqueued as soon as the host
   operation completes, whether or not anyone waits.

A group with an NCCL side (backend "nccl", or a map naming ``cuda:nccl``; ``_nccl.py``) takes
its device tensors there instead (``_nccl_ops.py``), for the operations NCCL runs; the others
(the coalesced forms), and every operation of a group whose ranks
share a GPU that its NCCL cannot, are staged here. An all_reduce of a group whose ranks are
all on this host goes through device memory exported by IPC instead (``_device_ipc.py``:
the ``ipc_collectives`` feature; the choice is the group's, the same on every rank).
With backend "nccl" open and staging closed, a group without an NCCL side gets the entry point as it is.

Rules kept: a pinned buffer (and the device tensors it served) is reused or dropped only after
the event recorded behind its last copy has completed; nothing here runs for host tensors and
nothing initialises CUDA in a process that has no CUDA tensor (the simulated runtime is
consulted only when this process has made it). While the feature is closed, device tensors go
to the entry point as they are, which rejects CUDA tensors with its usual message.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

import torch

from ringtorch import _config, _device
from ringtorch._device.api import DeviceEvent, DeviceRuntime, DeviceStream
from ringtorch._device.confirmed import confirmed
from ringtorch.collectives.work import DeviceWork, Work
from ringtorch.distributed import _device_ipc, _nccl, _nccl_ops

FEATURE = "cuda_tensors"
_KEEP_PER_SHAPE = 4  # pinned buffers kept per (runtime, numel, dtype) for reuse


class _Buffer:
    """A pinned host buffer, free once ``event`` (if any) has completed; ``keep`` holds the
    device tensors its copies read or wrote until then."""

    def __init__(self, host: torch.Tensor) -> None:
        self.host = host
        self.event: DeviceEvent | None = None
        self.keep: list[torch.Tensor] = []

    def free(self) -> bool:
        return self.event is None or self.event.query()


class _State:
    """Staging streams per (runtime, device) and the pool of pinned buffers (this
    subsystem's one state object)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.streams: dict[tuple[str, int], DeviceStream] = {}
        self.pool: dict[tuple[str, int, torch.dtype], list[_Buffer]] = {}
        self.local = threading.local()  # .plain: an entry point called as it is, not routed


_state = _State()


def opened() -> bool:
    """Whether device tensors go through staging (see the module docstring)."""
    return bool(_config.DEVICE_UNCONFIRMED.get()) or confirmed(FEATURE)


def staging_stream(rt: DeviceRuntime, device: int) -> DeviceStream:
    """The stream the staging copies of GPU ``device`` run on (tests keep it busy)."""
    key = (rt.name, device)
    with _state.lock:
        stream = _state.streams.get(key)
    if stream is None:
        made = rt.new_stream(device)
        with _state.lock:
            stream = _state.streams.setdefault(key, made)
    return stream


def _acquire(rt: DeviceRuntime, like: torch.Tensor) -> _Buffer:
    key = (rt.name, like.numel(), like.dtype)
    with _state.lock:
        entries = _state.pool.setdefault(key, [])
        for i, entry in enumerate(entries):
            if entry.free():
                entries.pop(i)
                entry.event, entry.keep = None, []
                return entry
    return _Buffer(rt.pinned_empty((like.numel(),), like.dtype))


def _release(rt: DeviceRuntime, buffers: list[_Buffer], event: DeviceEvent | None) -> None:
    with _state.lock:
        for buf in buffers:
            buf.event = event
            entries = _state.pool.setdefault((rt.name, buf.host.numel(), buf.host.dtype), [])
            if len(entries) < _KEEP_PER_SHAPE:
                entries.append(buf)
            else:  # over the cap: drop the oldest one that is done (its memory goes back)
                for i, entry in enumerate(entries):
                    if entry.free():
                        entries[i] = buf
                        break


def _device_runtime(values: Any, sim: DeviceRuntime | None) -> DeviceRuntime | None:
    """The runtime of the first device tensor among ``values`` (tensors, lists of them,
    lists of lists); ``sim``: the simulated runtime if this process made one."""
    for t in values:
        if type(t) is not torch.Tensor:
            if isinstance(t, (list, tuple)):
                found = _device_runtime(t, sim)
                if found is not None:
                    return found
            continue
        if t.is_cuda:
            rt = _device.runtime()
            return rt if rt.name == "cuda" else None
        if sim is not None and sim.is_device(t):
            return sim
    return None


class _Stage:
    """One staged call: the host buffers standing in for the device tensors, its streams
    and events."""

    def __init__(self, rt: DeviceRuntime, device: int) -> None:
        self.rt = rt
        self.device = device
        self.stream = staging_stream(rt, device)
        self.reads: list[tuple[torch.Tensor, _Buffer]] = []
        self.writes: list[tuple[torch.Tensor, torch.Tensor]] = []  # (device, host view)
        self.buffers: list[_Buffer] = []
        self.by_host: dict[int, torch.Tensor] = {}  # id(host view) -> its device tensor
        self.back: DeviceEvent | None = None
        self.lock = threading.Lock()

    def swap(self, value: Any, read: bool, write: bool) -> Any:
        """``value`` with each device tensor replaced by a host view of a pinned buffer."""
        if isinstance(value, (list, tuple)):
            return type(value)(self.swap(v, read, write) for v in value)
        if type(value) is not torch.Tensor or not self.rt.is_device(value):
            return value
        buf = _acquire(self.rt, value)
        buf.keep.append(value)
        host = buf.host.view(value.shape)
        self.buffers.append(buf)
        self.by_host[id(host)] = value
        if read:
            self.reads.append((value, buf))
        if write:
            self.writes.append((value, host))
        return host

    def copy_in(self) -> None:
        """Order the staging stream after the caller's queued work; copy the reads to host."""
        ready = self.rt.new_event()
        ready.record(self.rt.current_stream(self.device))
        self.stream.wait_event(ready)
        if not self.reads:
            return
        for dev, buf in self.reads:
            self.rt.copy(buf.host.view(dev.shape), dev, self.stream)
        copied = self.rt.new_event()
        copied.record(self.stream)
        copied.synchronize()

    def copy_back(self, failed: bool) -> None:
        """Enqueue the copies back to the device (once; none after a failure) and release
        the buffers behind the last event."""
        with self.lock:
            if self.back is not None or not self.buffers:
                return
            if not failed:
                for dev, host in self.writes:
                    self.rt.copy(dev, host, self.stream)
            self.back = self.rt.new_event()
            self.back.record(self.stream)
            _release(self.rt, self.buffers, self.back)
            self.buffers = []

    def join(self) -> None:
        """Make the calling thread's current stream wait for the copy-back."""
        if self.back is not None:
            self.back.wait(self.rt.current_stream(self.device))

    def device_of(self, t: Any) -> Any:
        return self.by_host.get(id(t), t)


class StagedWork(DeviceWork):
    """The Work of an asynchronous staged operation: the host operation's Work, with
    ``wait``/``synchronize`` making the current stream wait for the copy-back."""

    def __init__(self, inner: Work, stage: _Stage) -> None:
        super().__init__(inner.op_name, inner.seq, None, None, inner.group_name)
        self._inner = inner
        self._stage = stage
        # the copy-back goes on the staging stream as soon as the host operation is done
        inner.get_future().add_done_callback(lambda _: self._finish())

    def _finish(self) -> None:
        self._stage.copy_back(failed=self._inner.exception() is not None)

    def wait(self, timeout: Any = None) -> bool:
        self._inner.wait(timeout)
        self._finish()
        self._stage.join()
        return True

    def is_completed(self) -> bool:
        return self._inner.is_completed()

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self) -> BaseException | None:
        return self._inner.exception()

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return [self._stage.device_of(t) for t in self._inner.result()]

    def source_rank(self) -> int:
        return self._inner.source_rank()

    def get_future(self) -> torch.futures.Future:
        return self._inner.get_future().then(functools.partial(_settled, self._stage))

    def __repr__(self) -> str:
        return repr(self._inner)


def staged(reads: tuple[str, ...] = (), writes: tuple[str, ...] = ()) -> Callable[[Any], Any]:
    """Mark a facade entry point: its parameters ``reads`` (read by the operation) and
    ``writes`` (written by it) may hold device tensors or lists of them. The function is
    returned as it is (no wrapper: a frame more would cost every host call); its body starts
    with ``if (rt := device_runtime(...)) is not None: return staged_call(rt, fn, locals())``.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn._staging = (tuple(inspect.signature(fn).parameters), reads, writes)  # type: ignore[attr-defined]
        return fn

    return decorate


def device_runtime(*values: Any) -> DeviceRuntime | None:
    """The runtime to stage a call on when one of ``values`` (tensors, lists of them) is a
    device tensor and the feature is open; None otherwise (host tensors: the common case,
    a type check per value)."""
    rt = _device_runtime(values, _device.made("sim"))
    if rt is None or getattr(_state.local, "plain", False):
        return None
    if opened() or _nccl.opened():
        return rt
    return None


def staged_call(rt: DeviceRuntime, fn: Callable[..., Any], params: dict[str, Any]) -> Any:
    """Run the entry point ``fn`` (marked with :func:`staged`) with its parameters
    ``params`` (its ``locals()`` at entry), staged on ``rt``."""
    names, reads, writes = fn._staging  # type: ignore[attr-defined]
    kwargs = {name: params[name] for name in names if name in params}
    inner = inspect.unwrap(fn)
    side = _nccl_ops.group_of(kwargs.get("group"))
    if side is not None and _nccl_ops.supported(inner.__name__):
        present = [kwargs[n] for n in dict.fromkeys(reads + writes) if n in kwargs]
        side.ensure(rt.device_index(_first_device(rt, present)))
        if not side.shared_path:  # else ranks share a GPU this NCCL cannot: staged below
            return _nccl_ops.call(side, inner.__name__, kwargs)
    if inner.__name__ in _device_ipc.OPERATIONS and type(kwargs["tensor"]) is torch.Tensor \
            and rt.is_device(kwargs["tensor"]):
        # one host: IPC (also where ranks share a GPU); the path is the group's, not the call's
        took, result = _device_ipc.try_collective(rt, inner.__name__, kwargs,
                                                  rt.device_index(kwargs["tensor"]))
        if took:
            return result
    if side is None and not opened():  # backend "nccl" is open, staging is not: as before
        _state.local.plain = True
        try:
            return inner(**kwargs)
        finally:
            _state.local.plain = False
    # the inner call sees host tensors only, so it runs the entry point's own body (a
    # deprecated alias warns once, at the user's call)
    return _run(rt, inner, kwargs, reads, writes)


def _first_device(rt: DeviceRuntime, values: list[Any]) -> torch.Tensor:
    for value in values:
        for t in value if isinstance(value, (list, tuple)) else (value,):
            if type(t) is torch.Tensor and rt.is_device(t):
                return t
    raise AssertionError("no device tensor among the staged parameters")


def _settled(stage: _Stage, fut: torch.futures.Future) -> Any:
    """A staged operation's Future, done: copy back, wait for it (a callback's thread has no
    caller's stream to order), and hand out the device tensors."""
    try:
        value = fut.value()
    except BaseException:
        stage.copy_back(failed=True)
        raise
    stage.copy_back(failed=False)
    if stage.back is not None:
        stage.back.synchronize()
    if isinstance(value, list):
        return [stage.device_of(t) for t in value]
    return value


def _run(rt: DeviceRuntime, fn: Callable[..., Any], kwargs: dict[str, Any],
         reads: tuple[str, ...], writes: tuple[str, ...]) -> Any:
    present = [n for n in dict.fromkeys(reads + writes) if n in kwargs]
    stage = _Stage(rt, rt.device_index(_first_device(rt, [kwargs[n] for n in present])))
    for name in present:
        kwargs[name] = stage.swap(kwargs[name], name in reads, name in writes)
    stage.copy_in()
    try:
        result = fn(**kwargs)
    except BaseException:
        stage.copy_back(failed=True)
        raise
    if isinstance(result, Work):
        return StagedWork(result, stage)
    if isinstance(result, torch.futures.Future):  # the coalesced forms' async result
        return result.then(functools.partial(_settled, stage))
    stage.copy_back(failed=False)
    stage.join()
    return result

"""all_reduce, broadcast and all_gather of device tensors between the ranks of one host
through IPC-exported device memory, on the device with torch ops (the ``ipc_collectives``
feature).

Which path a group's device collectives take is a fact every rank of the group agrees on, so
that no rank waits on a path its peers do not take: it is the IPC path when the feature is
open and every rank of the group is on this host, decided once per group when its first
device collective arrives, from what the group's rendezvous learnt (its mesh's host of every
peer; a backend without one agrees through the group's store, once). The call itself (sync
or async, contiguous or not, on which device) never changes the path; the reduction op and
dtype, which torch requires to match across ranks, may (bitwise ops, AVG of integers, bool
and complex tensors are staged; AVG of floating point is the sum divided on the device);
``RINGTORCH_DEVICE_IPC=0`` turns the path off (set alike on every rank).
``RINGTORCH_DEBUG=INFO`` logs the path each rank takes per group.

Each rank keeps one device buffer per group (grown as needed, to the same size on every rank:
an all_reduce's or broadcast's tensors match, an all_gather's output list is the same
everywhere), exported once per size by IPC and opened by its peers,
and two interprocess events: ``written`` (its input is in its buffer) and ``done`` (it has
finished reading its peers' buffers). Rounds run in call order on the group's IPC thread, so
an asynchronous call returns at once; the caller's current stream is captured at the call.
Round ``k``:

1. wait (on the host) for every peer's "done k-1" key, then make the IPC stream wait for each
   peer's ``done`` event: a buffer is overwritten only after every peer has read it;
2. the IPC stream waits for the caller's stream as it was at the call, copies the input into
   this rank's buffer and records ``written``; the host sets "written k";
3. wait for every peer's "written k" key; the IPC stream waits for each peer's ``written``
   event and writes the outputs from the ranks' buffers (all_reduce: reduced in rank order,
   so every rank gets the same bits; broadcast: the source's; all_gather: each rank's);
   records ``done``; the host sets "done k";
4. the caller's current stream waits for the round (at once for a synchronous call, in
   ``Work.wait()`` for an asynchronous one).

The IPC thread sets a round's key only once the event it announces has completed, so a
rank that dies after its key leaves its peers nothing to wait for on the device (an IPC event
of a dead process may never fire); a synchronous call thus returns once its round is done on
the device, an asynchronous one at once.

Rounds are synchronised through the group's store: an event must be recorded before a peer
waits on it (a wait placed earlier is a no-op), so a host-side handshake per round is needed
whatever carries it, and the store is the one channel every group has on any backend, with
the liveness records beside it. Waits poll the peers' liveness: a peer whose process has
exited raises ``PeerLostError`` naming it; none is late past the group's timeout.
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import time
import weakref
from datetime import timedelta
from typing import Any

import torch

from ringtorch import _config
from ringtorch._device.api import DeviceEvent, DeviceRuntime
from ringtorch._device.confirmed import confirmed
from ringtorch._errors import DistBackendError, DistStoreError, PeerLostError
from ringtorch.collectives import liveness
from ringtorch.collectives.liveness import host_identity
from ringtorch.collectives.work import DeviceWork, Work
from ringtorch.distributed import _args as a

FEATURE = "ipc_collectives"
OPERATIONS = ("all_reduce", "broadcast", "all_gather")  # the facade's entry points taken
_POLL = timedelta(seconds=0.5)  # how long one store wait lasts before the peers are probed
_OPS = {"SUM": torch.add, "PRODUCT": torch.mul, "MAX": torch.maximum, "MIN": torch.minimum}
log = logging.getLogger(__name__)


class IpcWork(DeviceWork):
    """The Work of an asynchronous IPC collective: ``wait()`` waits for the host's part of
    the round, then makes the waiting thread's current stream wait for its device part."""

    __slots__ = ("_rt", "_device", "_finished")

    def __init__(self, rt: DeviceRuntime, device: int, finished: DeviceEvent, run: Any,
                 outputs: list[torch.Tensor], group_name: str) -> None:
        super().__init__("ipc", -1, run, outputs, group_name)
        self._rt, self._device, self._finished = rt, device, finished

    def wait(self, timeout: Any = None) -> bool:
        super().wait(timeout)
        self._finished.wait(self._rt.current_stream(self._device))
        return True

    def get_future(self) -> torch.futures.Future:
        # done once the round is done on the device: a callback's thread has no caller's
        # stream to be ordered on (comm hooks read the result in their callbacks)
        return super().get_future().then(self._settled)

    def _settled(self, fut: torch.futures.Future) -> Any:
        value = fut.value()
        self._finished.synchronize()
        return value


def _serve(jobs: queue.SimpleQueue[Work | None]) -> None:
    """The IPC thread of one group: runs its rounds in call order (holds no link: the link's
    finalizer ends it)."""
    while (work := jobs.get()) is not None:
        work.run()
        del work


class _Link:
    """One group's IPC state on this rank: its buffer, events, stream and its peers'."""

    def __init__(self, rt: DeviceRuntime, group: Any, device: int) -> None:
        self.rt = rt
        self.store = group.get_group_store()
        self.rank = group.rank()
        self.size = group.size()
        self.name = group.group_name
        self.device = device
        self.timeout = group.timeout
        self.stream = rt.new_stream(device)
        self.written = rt.new_event(interprocess=True)
        self.done = rt.new_event(interprocess=True)
        self.capacity = 0  # bytes of ``buffer`` (0: none yet)
        self.buffer: torch.Tensor | None = None
        self.views: list[torch.Tensor | None] = []  # every rank's buffer (this rank's own)
        self.peer_events: dict[int, tuple[Any, Any]] = {}
        self.round = 0
        self.jobs: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(self.jobs,), daemon=True,
                         name=f"ringtorch-ipc-{self.name}").start()
        weakref.finalize(self, self.jobs.put, None)

    def peers(self) -> list[int]:
        return [r for r in range(self.size) if r != self.rank]

    def wait_keys(self, what: str, keys: dict[int, str]) -> None:
        """Wait for the keys (rank -> key) of the peers; a dead peer raises at once."""
        deadline = time.monotonic() + self.timeout.total_seconds()
        missing = dict(keys)
        while missing:
            try:
                self.store.wait(list(missing.values()),
                                min(_POLL, timedelta(seconds=max(deadline - time.monotonic(),
                                                                 0.001))))
                return
            except DistStoreError:
                pass
            missing = {r: k for r, k in missing.items() if not self.store.check([k])}
            for r in missing:
                if liveness.probe(self.store, r) is False:
                    raise PeerLostError(
                        f"all_reduce on device tensors (group '{self.name}'): rank {r}'s "
                        f"process exited while rank {self.rank} waited for it ({what}); the "
                        f"operation failed")
            if missing and time.monotonic() >= deadline:
                raise DistBackendError(
                    f"all_reduce on device tensors (group '{self.name}'): rank(s) "
                    f"{sorted(missing)} did not reach the same round within {self.timeout} "
                    f"(rank {self.rank} waited for {what})")

    def fit(self, nbytes: int) -> None:
        """Grow the buffer to hold ``nbytes`` (collective: every rank grows at the same round)
        and exchange handles (the events' with the first buffer)."""
        if nbytes <= self.capacity:
            return
        size = max(1 << max(nbytes - 1, 0).bit_length(), 4096)
        if self.buffer is not None:  # peers may still read the old one: wait for them
            for _, done in self.peer_events.values():
                done.synchronize()
            self.stream.synchronize()
        self.buffer = self.rt.empty((size,), torch.uint8, self.device)
        exported = self.rt.export(self.buffer)
        first = not self.peer_events
        events = (self.written.ipc_handle(), self.done.ipc_handle()) if first else None
        self.store.set(f"ipc/buf/{size}/{self.rank}", pickle.dumps((exported, events)))
        keys = {r: f"ipc/buf/{size}/{r}" for r in self.peers()}
        self.wait_keys("its device buffer's handle", keys)
        self.views = [None] * self.size
        self.views[self.rank] = self.buffer
        for r, key in keys.items():
            buf, handles = pickle.loads(self.store.get(key))
            self.views[r] = self.rt.open(buf)
            if first:
                self.peer_events[r] = (self.rt.open_event(handles[0], self.device),
                                       self.rt.open_event(handles[1], self.device))
        self.capacity = size

    def submit(self, tensor: torch.Tensor, finish: Any, outputs: list[torch.Tensor],
               nbytes: int, device: int, async_op: bool) -> IpcWork | None:
        """Queue one round: ``tensor`` is this rank's input, ``finish(parts)`` (on the IPC
        stream; ``parts``: every rank's buffer) writes the outputs, all in stream order with
        the calling thread's current stream of ``device``; ``nbytes``: the buffer size every
        rank needs (the same on every rank). A synchronous call waits for its host part."""
        ready = self.rt.new_event()
        ready.record(self.rt.current_stream(device))
        finished = self.rt.new_event()

        def run(_: Work) -> None:
            self.exchange(tensor, finish, nbytes, ready, finished)

        work = IpcWork(self.rt, device, finished, run, outputs, self.name)
        self.jobs.put(work)
        if async_op:
            return work
        work.wait()
        return None

    def exchange(self, tensor: torch.Tensor, finish: Any, nbytes: int, ready: DeviceEvent,
                 finished: DeviceEvent) -> None:
        """One round (see the module docstring), on the IPC thread."""
        k = self.round
        self.round += 1
        if k > 0:
            self.wait_keys("the end of the previous round",
                           {r: f"ipc/{k - 1}/done/{r}" for r in self.peers()})
            for _, done in self.peer_events.values():
                self.stream.wait_event(done)
        self.fit(nbytes)
        rt, stream = self.rt, self.stream
        stream.wait_event(ready)
        mine = tensor.numel() * tensor.element_size()
        own = self.buffer[:mine].view(tensor.dtype).view(tensor.shape)  # type: ignore[index]
        rt.copy(own, tensor, stream)  # a non-contiguous input lands contiguous
        self.written.record(stream)
        self.written.synchronize()  # a peer never waits on an event a dead rank left unfired
        self.store.set(f"ipc/{k}/written/{self.rank}", b"1")
        self.wait_keys("its input", {r: f"ipc/{k}/written/{r}" for r in self.peers()})
        for written, _ in self.peer_events.values():
            stream.wait_event(written)
        views = list(self.views)
        rt.launch(stream, lambda: finish(views))
        self.done.record(stream)
        finished.record(stream)
        self.done.synchronize()
        self.store.set(f"ipc/{k}/done/{self.rank}", b"1")
        if k >= 2:  # every peer has passed round k-1's keys: drop this rank's of k-2
            for key in (f"ipc/{k - 2}/written/{self.rank}", f"ipc/{k - 2}/done/{self.rank}"):
                self.store.delete_key(key)


def _part(buffer: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The start of a rank's buffer, as ``like`` (its shape, dtype and device: ranks with a
    GPU each read a peer's buffer across devices)."""
    nbytes = like.numel() * like.element_size()
    part = buffer[:nbytes].view(like.dtype).view(like.shape)
    return part if part.device == like.device else part.to(like.device, non_blocking=True)


class _State:
    """The link of each group of this process (None: its ranks span hosts), held weakly: a
    group's buffers, events, stream and thread go with the group; ``paths`` the path each
    group's device all_reduce takes (this subsystem's one state object)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.links: weakref.WeakKeyDictionary[Any, _Link | None] = weakref.WeakKeyDictionary()
        self.paths: dict[str, str] = {}


_state = _State()


def opened() -> bool:
    """Whether the IPC path may run (see the module docstring)."""
    return bool(_config.DEVICE_UNCONFIRMED.get()) or confirmed(FEATURE)


def _one_host(group: Any) -> tuple[bool, str]:
    """Whether every rank of ``group`` is on this host, and how that was learnt: from the
    group's rendezvous (its mesh) where its backend has one, else agreed through its store
    (collective, once per group)."""
    backend = group._get_backend(None)
    one_host = getattr(backend, "one_host", None)
    if one_host is not None:
        return bool(one_host), "the group's rendezvous"
    store, rank, size = group.get_group_store(), group.rank(), group.size()
    store.set(f"ipc/host/{rank}", host_identity())
    keys = [f"ipc/host/{r}" for r in range(size)]
    store.wait(keys, timedelta(seconds=group.timeout.total_seconds()))
    return len({store.get(k) for k in keys}) == 1, "the group's store"


def _link(rt: DeviceRuntime, group: Any, device: int) -> _Link | None:
    with _state.lock:
        known = group in _state.links
        link = _state.links.get(group)
    if known:
        return link
    if _config.DEVICE_IPC.get():
        one_host, source = _one_host(group)
    else:  # the path is off (alike on every rank: see docs/env-vars.md)
        one_host, source = False, "RINGTORCH_DEVICE_IPC=0"
    link = _Link(rt, group, device) if one_host else None
    path = "ipc" if link is not None else "staging"
    with _state.lock:
        _state.links[group] = link
        _state.paths[group.group_name] = path
    if _config.DEBUG.get() != "OFF":
        where = "on this host" if one_host else "on more than one host"
        why = (source if not _config.DEVICE_IPC.get() else
               f"its {group.size()} ranks are {where}, from {source}")
        log.info("group '%s' rank %d: all_reduce, broadcast and all_gather of device tensors "
                 "take the %s path (%s)",
                 group.group_name, group.rank(), path, why)
    return link


def _plain(*tensors: Any) -> bool:
    return all(type(t) is torch.Tensor and not t.is_complex() and t.dtype is not torch.bool
               for t in tensors)


def _all_reduce(link: _Link, kwargs: dict[str, Any], device: int) -> Any:
    tensor, op = kwargs["tensor"], kwargs.get("op")
    name = getattr(op, "name", str(op)).split(".")[-1].upper()
    # AVG: the sum in rank order, divided on the device (floating point: as the staged path)
    average = name == "AVG" and _plain(tensor) and tensor.is_floating_point()
    combine = torch.add if average else _OPS.get(name)
    if combine is None or not _plain(tensor):
        return False, None

    def reduce(views: list[torch.Tensor]) -> None:
        parts = [_part(v, tensor) for v in views]
        acc = parts[0].clone()
        for part in parts[1:]:
            acc = combine(acc, part)
        tensor.copy_(acc.div_(len(parts)) if average else acc)

    nbytes = tensor.numel() * tensor.element_size()
    return True, link.submit(tensor, reduce, [tensor], nbytes, device,
                             bool(kwargs.get("async_op")))


def _broadcast(link: _Link, kwargs: dict[str, Any], device: int, group: Any) -> Any:
    tensor = kwargs["tensor"]
    if not _plain(tensor):
        return False, None
    src = a.canonical_rank(group, kwargs.get("src"), kwargs.get("group_src"))

    def take(views: list[torch.Tensor]) -> None:
        if link.rank != src:
            tensor.copy_(_part(views[src], tensor))

    nbytes = tensor.numel() * tensor.element_size()
    return True, link.submit(tensor, take, [tensor], nbytes, device,
                             bool(kwargs.get("async_op")))


def _all_gather(link: _Link, kwargs: dict[str, Any], device: int) -> Any:
    outs, tensor = kwargs["tensor_list"], kwargs["tensor"]
    if (not isinstance(outs, (list, tuple)) or len(outs) != link.size or not _plain(tensor, *outs)
            or any(o.dtype != tensor.dtype for o in outs)):
        return False, None  # the staged path raises the entry point's error

    def gather(views: list[torch.Tensor]) -> None:
        for out, view in zip(outs, views, strict=True):
            out.copy_(_part(view, out))

    # every rank knows every rank's size (the output list): the same buffer size everywhere
    nbytes = max(o.numel() * o.element_size() for o in outs)
    return True, link.submit(tensor, gather, list(outs), nbytes, device,
                             bool(kwargs.get("async_op")))


def try_collective(rt: DeviceRuntime, name: str, kwargs: dict[str, Any], device: int) -> Any:
    """Run the facade's call ``name`` (all_reduce, broadcast or all_gather) with ``kwargs``
    on the IPC path if its group takes it (see the module docstring): returns ``(True,
    result)`` (None, or the Work of an async call), or ``(False, None)`` when the caller
    should stage it."""
    group = kwargs.get("group")
    if a.not_in_group(group) or not opened():
        return False, None
    group = a.group_or_default(group)
    if group.size() < 2:
        return False, None
    if name == "all_reduce":
        eligible = _plain(kwargs["tensor"]) and (
            getattr(kwargs.get("op"), "name", str(kwargs.get("op"))).split(".")[-1].upper()
            in (*_OPS, "AVG"))
    else:
        eligible = True
    if not eligible:
        return False, None
    link = _link(rt, group, device)
    if link is None or link.rt is not rt:
        return False, None
    if name == "all_reduce":
        return _all_reduce(link, kwargs, device)
    if name == "broadcast":
        return _broadcast(link, kwargs, device, group)
    return _all_gather(link, kwargs, device)

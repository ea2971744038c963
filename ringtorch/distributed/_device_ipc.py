"""all_reduce of device tensors between the ranks of one host through IPC-exported device
memory, reduced on the device with torch ops (the ``ipc_collectives`` feature).

When every rank of a group runs on this host, each rank keeps one device buffer per group
(grown as needed, to the same size on every rank since an all_reduce's tensors match),
exported once per size by IPC and opened by its peers, and two interprocess events:
``written`` (its input is in its buffer) and ``done`` (it has finished reading its peers'
buffers). Handles travel through the group's store once per buffer size. A round ``k``:

1. wait (on the host) for every peer's "done k-1" key, then make the IPC stream wait for each
   peer's ``done`` event: a buffer is overwritten only after every peer has read it;
2. the IPC stream waits for the caller's current stream (queued work is included), copies the
   input into this rank's buffer and records ``written``; the host sets "written k";
3. wait for every peer's "written k" key; the IPC stream waits for each peer's ``written``
   event and reduces the whole tensor from every rank's buffer, in rank order (every rank gets
   the same bits), into the caller's tensor; records ``done``; the host sets "done k";
4. the caller's current stream waits for ``done``; the call returns without blocking the host
   on device work.

Rounds are synchronised through the group's store: an event must be recorded before a peer
waits on it (a wait placed earlier is a no-op), so a host-side handshake per round is needed
whatever carries it, and the store is the one channel every group has on any backend, with
the liveness records beside it. Waits poll the peers' liveness: a peer whose process has
exited raises ``PeerLostError`` naming it; none is late past the group's timeout.

Rules kept: nothing here runs unless the feature is open and the group's ranks are all on this
host; operations, ops and dtypes it does not take (asynchronous calls, complex tensors, AVG,
bitwise ops, non-contiguous tensors) go to the staging path unchanged.
"""

from __future__ import annotations

import pickle
import threading
import time
import weakref
from datetime import timedelta
from typing import Any

import torch

from ringtorch import _config
from ringtorch._device.api import DeviceRuntime
from ringtorch._device.confirmed import confirmed
from ringtorch._errors import DistBackendError, DistStoreError, PeerLostError
from ringtorch._wire.mesh import host_identity
from ringtorch.collectives import liveness
from ringtorch.distributed import _args as a

FEATURE = "ipc_collectives"
_POLL = timedelta(seconds=0.5)  # how long one store wait lasts before the peers are probed
_OPS = {"SUM": torch.add, "PRODUCT": torch.mul, "MAX": torch.maximum, "MIN": torch.minimum}


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
        self.lock = threading.Lock()

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

    def all_reduce(self, tensor: torch.Tensor, combine: Any) -> None:
        """One round (see the module docstring); ``tensor`` is reduced in place."""
        with self.lock:
            k = self.round
            self.round += 1
            if k > 0:
                self.wait_keys("the end of the previous round",
                               {r: f"ipc/{k - 1}/done/{r}" for r in self.peers()})
                for _, done in self.peer_events.values():
                    self.stream.wait_event(done)
            nbytes = tensor.numel() * tensor.element_size()
            self.fit(nbytes)
            rt, stream = self.rt, self.stream
            stream.wait_stream(rt.current_stream(self.device))
            mine = self.buffer[:nbytes].view(tensor.dtype).view(tensor.shape)  # type: ignore[index]
            rt.copy(mine, tensor, stream)
            self.written.record(stream)
            self.store.set(f"ipc/{k}/written/{self.rank}", b"1")
            self.wait_keys("its input", {r: f"ipc/{k}/written/{r}" for r in self.peers()})
            for written, _ in self.peer_events.values():
                stream.wait_event(written)
            parts = [v[:nbytes].view(tensor.dtype).view(tensor.shape)  # type: ignore[index]
                     for v in self.views]

            def reduce() -> None:
                acc = parts[0].clone()
                for part in parts[1:]:
                    acc = combine(acc, part)
                tensor.copy_(acc)

            rt.launch(stream, reduce)
            self.done.record(stream)
            self.store.set(f"ipc/{k}/done/{self.rank}", b"1")
            if k >= 2:  # every peer has passed round k-1's keys: drop this rank's of k-2
                for key in (f"ipc/{k - 2}/written/{self.rank}", f"ipc/{k - 2}/done/{self.rank}"):
                    self.store.delete_key(key)
            rt.current_stream(self.device).wait_event(self.done)


class _State:
    """The link of each group of this process (None: not eligible), held weakly: a group's
    buffers, events and stream go with the group (this subsystem's one state object)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.links: weakref.WeakKeyDictionary[Any, _Link | None] = weakref.WeakKeyDictionary()


_state = _State()


def opened() -> bool:
    """Whether the IPC path may run (see the module docstring)."""
    return bool(_config.DEVICE_UNCONFIRMED.get()) or confirmed(FEATURE)


def _eligible(group: Any) -> bool:
    """Whether every rank of ``group`` is on this host (collective, once per group)."""
    store, rank, size = group.get_group_store(), group.rank(), group.size()
    store.set(f"ipc/host/{rank}", host_identity())
    deadline = timedelta(seconds=group.timeout.total_seconds())
    keys = [f"ipc/host/{r}" for r in range(size)]
    store.wait(keys, deadline)
    return len({store.get(k) for k in keys}) == 1


def try_all_reduce(rt: DeviceRuntime, kwargs: dict[str, Any], device: int) -> bool:
    """Run the facade's all_reduce call ``kwargs`` on the IPC path if it takes it; returns
    whether it did (else the caller stages it). A synchronous call only."""
    tensor, op, group = kwargs["tensor"], kwargs.get("op"), kwargs.get("group")
    if kwargs.get("async_op") or a.not_in_group(group) or not opened():
        return False
    combine = _OPS.get(getattr(op, "name", str(op)).split(".")[-1].upper())
    if (combine is None or type(tensor) is not torch.Tensor or tensor.is_complex()
            or not tensor.is_contiguous() or tensor.dtype is torch.bool):
        return False
    group = a.group_or_default(group)
    if group.size() < 2:
        return False
    with _state.lock:
        known = group in _state.links
        link = _state.links.get(group)
    if not known:
        link = _Link(rt, group, device) if _eligible(group) else None
        with _state.lock:
            _state.links[group] = link
    if link is None or link.device != device or link.rt is not rt:
        return False
    link.all_reduce(tensor, combine)
    return True

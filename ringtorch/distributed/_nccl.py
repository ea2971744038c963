"""Backend "nccl": a group's operations on device tensors, run by an NCCL communicator with
torch's ProcessGroupNCCL stream semantics.

A group whose backend map names ``cuda:nccl`` (``"nccl"``, ``"cpu:gloo,cuda:nccl"``) gets an
:class:`NcclGroup` beside its CPU backend; the facade sends it the operations whose tensors
are device tensors (``_nccl_ops.py``). The communicator is made at the group's first such
operation, or at once when ``init_process_group(device_id=...)`` binds a device: rank 0 makes
the unique id and passes it through the group's store; the init is non-blocking and aborted
at the group's timeout. Each group has one communication stream. An operation:

1. makes the communication stream wait for the caller's current stream (work queued before
   the call is included) and enqueues the NCCL call on it; the host does not wait;
2. records an end event; the Work (kept, with the caller's tensors, until the event
   completes) answers ``is_completed`` from it, and its ``wait()`` makes the waiting thread's
   current stream wait for it without blocking the host; ``async_op=False`` does that
   before returning.

A watchdog thread per group polls the communicator's async error, the end events, the
deadlines and the liveness of the group's processes on this host: a failed communicator, a
dead peer or an operation past the group's timeout aborts the communicator (from that thread,
the only safe place) and fails every pending and later operation with a
``DistBackendError`` naming the rank. Where ranks share one GPU and the NCCL library is older
than 2.30 (which refuses that), the group says so once and runs its all_reduce, broadcast
and all_gather over IPC between the ranks' device buffers (``_device_ipc``) and its other
device operations on the staged path (``_device_staging``) over its CPU backend instead.

Rules kept: no call here blocks the host on device work, except the communicator's init
(bounded by the timeout); nothing waits without a deadline.
"""

from __future__ import annotations

import socket
import threading
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from ringtorch import _device
from ringtorch._device import nccl_comm
from ringtorch._errors import DistBackendError
from ringtorch.collectives import liveness
from ringtorch.collectives.work import DeviceWork

SHARED_GPU_VERSION = 23000  # NCCL 2.30 accepts ranks sharing one GPU; older ones refuse
_POLL_S = 0.005
_LIVENESS_EVERY_S = 0.2
_ERROR_NAMES = {1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
                4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError"}


def opened() -> bool:
    """Whether backend "nccl" is open (``nccl_comm.is_open``)."""
    return nccl_comm.is_open()


def _library(store: Any, group_name: str, global_ranks: tuple[int, ...]) -> Any:
    from ringtorch.distributed import _nccl_fake

    if _nccl_fake.enabled():
        return _nccl_fake.FakeNccl(store, group_name, global_ranks)
    return nccl_comm.RealNccl()


class NcclWork(DeviceWork):
    """The Work of one NCCL operation: done when its end event has completed (or its group
    failed); ``wait()`` orders the waiting thread's current stream after it."""

    def __init__(self, group: NcclGroup, op_name: str, seq: int, end: Any,
                 outputs: list[torch.Tensor], keep: list[Any], deadline: float) -> None:
        super().__init__(op_name, seq, None, outputs, group.group_name)
        self._group = group
        self.end = end
        self.keep = keep  # the caller's tensors and scratch, alive until the end event
        self.deadline = deadline

    def wait(self, timeout: timedelta | None = None) -> bool:
        if self._exception is not None:
            raise self._exception
        self.end.wait(self._group.rt.current_stream(self._group.device))
        return True

    def is_completed(self) -> bool:
        if not self._done and self.end.query():
            self._group.settle(self)
        return self._done


class NcclGroup:
    """One group's NCCL side (see the module docstring).

    Args:
        store: the group's private store; rank, size: the group's; timeout: its timeout;
        group_name, global_ranks: for messages; device: the bound device index (eager init)
        or None (made at the first operation).
    """

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, group_name: str,
                 global_ranks: tuple[int, ...], device: int | None = None) -> None:
        self.store = store
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.group_name = group_name
        self.global_ranks = global_ranks
        self.rt = _device.runtime()
        self.lib: Any = None  # loaded with the communicator: a group may never need it
        self.device = device
        self.comm: Any = None
        self.stream: Any = None
        self.shared_path = False  # ranks share a GPU that this NCCL cannot: staged instead
        self.error: DistBackendError | None = None
        self.seq = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: list[NcclWork] = []
        self._closed = False
        if device is not None:
            self.ensure(device)

    # -- the communicator -----------------------------------------------------------------

    def ensure(self, device: int) -> None:
        """Make the communicator on GPU ``device`` if not made yet (collective: every rank's
        first device operation on the group, or init_process_group with ``device_id``).

        Raises:
            DistBackendError: the group failed before, its init failed or did not finish
                within the timeout (then aborted), or a peer did not publish its part.
            ValueError: ``device`` is not the group's device.
        """
        if self.error is not None:
            raise self.error
        if self.comm is not None or self.shared_path:
            if device != self.device:
                raise ValueError(f"group '{self.group_name}' runs NCCL on cuda:{self.device}; "
                                 f"a tensor on cuda:{device} cannot join it")
            return
        self.device = device
        if self.lib is None:
            self.lib = _library(self.store, self.group_name, self.global_ranks)
        deadline = time.monotonic() + self.timeout.total_seconds()
        if self._shares_gpu(deadline) and self.lib.version() < SHARED_GPU_VERSION:
            self.shared_path = True
            warnings.warn(
                f"ProcessGroup 'nccl' (group '{self.group_name}'): ranks of this group share "
                f"one GPU, which NCCL {_version(self.lib.version())} refuses (2.30 or later "
                f"accepts it); its all_reduce, broadcast and all_gather run over IPC "
                f"between the ranks' device buffers instead, its other operations on device "
                f"tensors on ringtorch's staged path", stacklevel=4)
            return
        if self.rank == 0:
            self.store.set("nccl/unique_id", self.lib.unique_id())
        unique_id = self._fetch("nccl/unique_id", deadline)
        comm = self.lib.init_rank(self.size, unique_id, self.rank, device)
        while (code := comm.async_error()) == nccl_comm.IN_PROGRESS:
            if time.monotonic() > deadline:
                comm.abort()
                self.error = DistBackendError(
                    f"the NCCL communicator of group '{self.group_name}' was not ready on "
                    f"rank {self.rank} within {self.timeout} (its init was still in progress: "
                    f"a peer did not join); it was aborted")
                raise self.error
            time.sleep(_POLL_S)
        if code != nccl_comm.SUCCESS:
            comm.abort()
            self.error = DistBackendError(
                f"the NCCL communicator of group '{self.group_name}' failed to initialise on "
                f"rank {self.rank}: {_ERROR_NAMES.get(code, code)} {comm.error_text()}".rstrip())
            raise self.error
        self.comm = comm
        self.stream = self.rt.new_stream(device)
        threading.Thread(target=self._watch, name=f"ringtorch-nccl-watchdog-{self.group_name}",
                         daemon=True).start()

    def _fetch(self, key: str, deadline: float) -> bytes:
        remaining = max(deadline - time.monotonic(), 0.001)
        try:
            self.store.wait([key], timedelta(seconds=remaining))
        except Exception as exc:
            raise DistBackendError(
                f"group '{self.group_name}': rank {self.rank} did not get {key!r} from the "
                f"group's store within {self.timeout}: {exc}") from exc
        return self.store.get(key)

    def _shares_gpu(self, deadline: float) -> bool:
        """Whether two ranks of the group run on one GPU (each publishes its host and GPU)."""
        if self.size == 1:
            return False
        self.store.set(f"nccl/gpu/{self.rank}", f"{socket.gethostname()}/{self._gpu_id()}")
        seen = [self._fetch(f"nccl/gpu/{r}", deadline) for r in range(self.size)]
        return len(set(seen)) < len(seen)

    def _gpu_id(self) -> str:
        if self.rt.name == "cuda":
            return str(torch.cuda.get_device_properties(self.device).uuid)
        return f"sim{self.device}"

    # -- operations -----------------------------------------------------------------------

    def run(self, op_name: str, device: int, enqueue: Callable[[Any, Any], None],
            outputs: list[torch.Tensor], keep: list[Any], async_op: bool) -> NcclWork | None:
        """One operation: ``enqueue(comm, stream)`` puts its NCCL calls on the communication
        stream after the caller's current stream's work (see the module docstring)."""
        self.ensure(device)
        stream = self.stream
        stream.wait_stream(self.rt.current_stream(device))
        enqueue(self.comm, stream)
        end = self.rt.new_event()
        end.record(stream)
        work = NcclWork(self, op_name, self.seq, end, outputs, keep,
                        time.monotonic() + self.timeout.total_seconds())
        self.seq += 1
        with self._wake:
            if self.error is not None:  # failed meanwhile: nothing it enqueued will run
                raise self.error
            self._pending.append(work)
            self._wake.notify()
        if async_op:
            return work
        work.wait()
        return None

    def settle(self, work: NcclWork) -> None:
        """Complete ``work`` (its end event has completed) and let go of its tensors; unless
        the communicator failed, which fails it (a failed NCCL kernel may still finish)."""
        if self._comm_failed():
            return
        with self._lock:
            if work in self._pending:
                self._pending.remove(work)
        work.keep = []
        work._complete(None)

    # -- the watchdog -----------------------------------------------------------------------

    def _watch(self) -> None:
        last_probe = 0.0
        while True:
            with self._wake:
                if self._closed or self.error is not None:
                    return
                if not self._pending:
                    self._wake.wait(_LIVENESS_EVERY_S)
                pending = list(self._pending)
            if self._comm_failed():
                return
            now = time.monotonic()
            for work in pending:
                if work.end.query():
                    self.settle(work)
                elif now > work.deadline:
                    self._fail(f"{work.op_name} #{work.seq} timed out after {self.timeout}"
                               + self._dead_ranks())
                    return
            if pending and now - last_probe > _LIVENESS_EVERY_S:  # a peer matters to work
                last_probe = now
                dead = self._dead_ranks()
                if dead:
                    self._fail(f"a peer is gone{dead}")
                    return
            time.sleep(_POLL_S)

    def _comm_failed(self) -> bool:
        """Whether the communicator reports an error (then the group fails with it)."""
        code = self.comm.async_error()
        if code in (nccl_comm.SUCCESS, nccl_comm.IN_PROGRESS):
            return False
        self._fail(f"the NCCL communicator reported {_ERROR_NAMES.get(code, code)}"
                   + self._dead_ranks() + _said(self.comm.error_text()))
        return True

    def _dead_ranks(self) -> str:
        dead = [r for r in range(self.size) if r != self.rank
                and liveness.probe(self.store, r) is False]
        if not dead:
            return ""
        return "; " + ", ".join(f"rank {self.global_ranks[r]}" for r in dead) + (
            " has exited" if len(dead) == 1 else " have exited")

    def _fail(self, why: str) -> None:
        error = DistBackendError(f"NCCL communicator of group '{self.group_name}' aborted on "
                                 f"rank {self.global_ranks[self.rank]}: {why}")
        with self._lock:
            if self.error is not None:
                return
            self.error = error
            pending, self._pending = self._pending, []
        self.comm.abort()
        for work in pending:
            work.keep = []
            work._complete(error)

    def close(self, abort: bool) -> None:
        """The group is destroyed (``abort``: aborted): stop the watchdog, free the
        communicator; later operations raise."""
        with self._wake:
            if self._closed:
                return
            self._closed = True
            self._wake.notify()
            if self.error is None:
                self.error = DistBackendError(f"process group '{self.group_name}' has been "
                                              f"destroyed")
        if self.comm is not None:
            try:
                if abort or self._pending:
                    self.comm.abort()
                else:
                    self.comm.destroy()
            except Exception:  # a communicator that cannot be destroyed is aborted
                self.comm.abort()


def _said(text: str) -> str:
    return f" ({text})" if text else ""


def _version(code: int) -> str:
    from ringtorch._device.nccl_lib import version_string

    return version_string(code)

"""GroupBase: what a ProcessGroup is (rank, size, names) and how its work runs.

The operations themselves live in mixins (reductions.py, movement.py, p2p.py) that call
``_collective`` to submit a collective to the group's lane (comm_thread.py): the lane stamps
it with the group's sequence number and runs it in order, on the caller's thread when the
call is synchronous and the lane idle, else on the group's communication thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch

from ringtorch._errors import DistBackendError
from ringtorch._observe.operation import COLLECTIVE, Operation
from ringtorch._observe.recorder import RECORDER
from ringtorch.collectives import profiling
from ringtorch.collectives.backends.base import Backend
from ringtorch.collectives.call import CollectiveCall, facade_call
from ringtorch.collectives.comm_thread import Lane, WorkerPool
from ringtorch.collectives.work import Work

# (group, call, [(shape, dtype), ...]) -> raises if the ranks disagree (installed by
# ringtorch.distributed when RINGTORCH_DEBUG=DETAIL); the call names the collective (its
# facade op name, sequence number, group) and carries its deadline.
CollectiveCheck = Callable[[Any, CollectiveCall, list[tuple[tuple[int, ...], torch.dtype]]],
                           None]
RunFn = Callable[[Operation], Any]

# Where the user's frame is, for the flight recorder (FlightRecorder.add's ``hint``): frames
# from _collective up to the public function that the user called: _collective (1), the
# group's method (2), ringtorch.distributed's function (3). A caller that adds frames above
# the group's method (torch's functions, through the backend door) says how many in the
# group's ``site_depth``. Counted rather than walked: a walk up to the first frame outside
# ringtorch and torch costs each all_reduce 0.1-0.8 us more (docs/observability.md).
SITE_DEPTH = 3
# How long a destroyed group waits for its lane's thread to finish the Work it runs (its
# backend is closed, so that Work fails at once): bounded, so a completion callback that
# blocks cannot hold destroy_process_group up.
_LANE_JOIN_S = 2.0


class GroupBase:
    """A group of ranks: identity, ordering of its work, life cycle (see ProcessGroup).

    Args:
        store: the group's private store (what its backend rendezvoused through).
        rank, size: this process's group rank and the number of ranks.
        backend: the object that moves the bytes (None: every operation raises).
        backend_name: what ``name()`` reports ("gloo" for ringtorch's native backend).
        group_name, group_desc: the group's name ("0", "1", ...) and description.
        timeout: the default timeout of one operation.
        global_ranks: the global rank of each group rank.
    """

    def __init__(self, store: Any, rank: int, size: int, *, backend: Backend | None = None,
                 backend_name: str = "gloo", group_name: str = "", group_desc: str = "undefined",
                 timeout: timedelta = timedelta(minutes=30),
                 global_ranks: Sequence[int] | None = None) -> None:
        RECORDER.settle()
        self._store = store
        self._rank = rank
        self._size = size
        self._backend = backend
        self._backend_name = backend_name
        self._group_name = group_name
        self._group_desc = group_desc
        self._timeout = timeout
        self._timeout_s = timeout.total_seconds()
        self._global_ranks = tuple(global_ranks) if global_ranks is not None else tuple(
            range(size))
        label = f"ringtorch-pg{group_name or '?'}"
        self._collectives = Lane(label)
        self._pool = WorkerPool(label)
        self._p2p_lanes: dict[tuple[str, int | None, int], Lane] = {}
        self._p2p_lock = threading.Lock()
        self._self_box: Any = None
        self._shut = False
        self.collective_check: CollectiveCheck | None = None
        # How many frames a caller above the facade's adds between the user's call and this
        # group's method (torch's functions, through the backend door): the flight
        # recorder's first guess at the call site, so that it need not walk the stack.
        self.site_depth = 0
        self.bound_device_id: torch.device | None = None
        # the group's side for device tensors (backend "nccl"), set by the facade; closed
        # with the group
        self.device_backend: Any = None

    # -- what the group is ----------------------------------------------------------------

    def rank(self) -> int:
        """This process's rank in the group."""
        return self._rank

    def size(self) -> int:
        """The number of ranks in the group."""
        return self._size

    def name(self) -> str:
        """The backend's name, as torch's ``ProcessGroup.name()`` reports it ("gloo")."""
        return self._backend_name

    @property
    def group_name(self) -> str:
        """The group's name: "0" for the default group, then "1", "2", ... in creation order."""
        return self._group_name

    @property
    def group_desc(self) -> str:
        """The group's description ("default_pg", or what ``new_group`` was given)."""
        return self._group_desc

    @property
    def global_ranks(self) -> tuple[int, ...]:
        """The global rank of each group rank."""
        return self._global_ranks

    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device("cpu")]

    def get_group_store(self) -> Any:
        """The group's private store."""
        return self._store

    def _get_backend_name(self) -> str:
        return self._backend_name

    def _get_backend(self, device: Any = None) -> Backend | None:
        return self._backend

    @property
    def shares_memory(self) -> bool:
        """Whether :meth:`shared_tensor` can place tensors in memory the group's ranks share
        (ringtorch's backend on one host; not in torch)."""
        return self._backend is not None and self._backend.shares_memory

    def shared_tensor(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A zero-filled 1-D tensor for repeated all_reduces (a ringtorch extension, not in
        torch): in the group's shared memory where it has some (:attr:`shares_memory`), whose
        all_reduce of exactly this tensor then skips the copy in; an ordinary tensor
        otherwise, so callers need no other path. DDP puts its large buckets there.

        Collective: every rank of the group calls it with the same ``numel`` and ``dtype``
        at the same place among the group's collectives. Allocate once, not per step: the
        memory stays mapped until the group is destroyed.

        Raises:
            DistBackendError: the group has no backend, or a peer died, aborted or is late.
        """
        return self._backend_or_raise().shared_tensor(numel, dtype)

    def _get_sequence_number_for_group(self) -> int:
        """How many collectives this group has issued (the next one's sequence number)."""
        return self._collectives.next_seq

    def _set_sequence_number_for_group(self) -> None:
        """Nothing to do: sequence numbers start at 0 on every rank of a new group."""

    @property
    def timeout(self) -> timedelta:
        """The default timeout of this group's operations."""
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        """Change the default timeout of later operations."""
        if not isinstance(timeout, timedelta):
            raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, "
                            f"got {timeout}")
        self._timeout = timeout
        self._timeout_s = timeout.total_seconds()

    def __repr__(self) -> str:
        return (f"<ProcessGroup name={self._group_name!r} rank={self._rank} size={self._size} "
                f"backend={self._backend_name!r}>")

    # -- collectives ------------------------------------------------------------------------

    def _collective(self, op_name: str, opts: Any, fn: RunFn, described: list[torch.Tensor],
                    outputs: list[torch.Tensor], shapes: bool = True,
                    recorded: list[torch.Tensor] | None = None) -> Work:
        """Submit one collective to the group's lane; synchronous ones may run right here.

        ``described`` are the tensors whose shapes and dtypes must agree across ranks (what the
        DETAIL check compares); with ``shapes=False`` only their dtypes must (all-to-all parts
        differ in size from rank to rank). ``recorded``: the inputs torch.profiler records
        for the operation, where they are not ``described`` (torch's gloo records the inputs
        only, e.g. an all_gather's input tensor and not its outputs).
        """
        timeout = getattr(opts, "timeout", None)
        o = Operation(COLLECTIVE, self._group_name, op_name)
        # its deadline is taken from this as it starts (Work.run)
        o.timeout = self._timeout_s if timeout is None else self._seconds(timeout)
        check = self.collective_check
        if check is not None:  # RINGTORCH_DEBUG=DETAIL: the ranks compare the call first
            fn = self._checked(fn, check, op_name, [
                (tuple(t.shape) if shapes else (), t.dtype) for t in described])
        work = Work(op_name, -1, fn, outputs, operation=o)
        if RECORDER.on:
            RECORDER.add(o, SITE_DEPTH + self.site_depth)
        inline = not getattr(opts, "asyncOp", True)
        if profiling.profiler_on():
            o.profile = profiling.begin(self._backend_name, op_name, self._profile_id(),
                                        described, outputs, recorded=recorded)
            inline = False  # its range ends on the lane's thread: asynchronous (profiling.py)
        self._collectives.submit(work, inline=inline, collective=True)
        return work

    def _checked(self, fn: RunFn, check: CollectiveCheck, op_name: str,
                 fingerprint: list[tuple[tuple[int, ...], torch.dtype]]) -> RunFn:
        """``fn`` preceded by the DETAIL check of the ranks' shapes and dtypes."""
        def run(o: Operation) -> Any:
            check(self, facade_call(op_name, o.seq, self._group_name, o.deadline), fingerprint)
            return fn(o)

        return run

    def _profile_id(self) -> tuple[str, int, int]:
        """(name, rank, size): how torch.profiler's ranges name this group."""
        return self._group_name, self._rank, self._size

    def _seconds(self, timeout: timedelta | None) -> float:
        if timeout is None:
            return self._timeout_s
        chosen = timeout
        if not isinstance(chosen, timedelta):
            raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, "
                            f"got {chosen}")
        return chosen.total_seconds()

    def _backend_or_raise(self) -> Backend:
        if self._backend is None:
            raise DistBackendError(f"process group '{self._group_name}' has no backend")
        return self._backend

    # -- life cycle -------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Fail queued work, close the backend's connections; later calls raise."""
        self._stop(f"process group '{self._group_name}' has been destroyed", abort=False)

    def abort(self, reason: str | None = None) -> None:
        """Like shutdown, but tell the peers first so that their pending work fails too
        (``reason``: what they are told, unless the group failed before)."""
        self._stop(reason or f"process group '{self._group_name}' was aborted", abort=True)

    def _stop(self, reason: str, abort: bool) -> None:
        if self._shut:
            return
        self._shut = True
        error = DistBackendError(reason)
        self._collectives.close(error)
        with self._p2p_lock:
            lanes = list(self._p2p_lanes.values())
        for lane in lanes:
            lane.close(error)
        if self._self_box is not None:
            self._self_box.close(error)
        if self.device_backend is not None:
            self.device_backend.close(abort)
        if self._backend is not None:
            if abort:
                self._backend.abort(reason)
            self._backend.close()
        if not abort:  # destroyed: the lane's thread ends with the group, as gloo's threads do
            self._collectives.join(_LANE_JOIN_S)



__all__ = ["SITE_DEPTH", "CollectiveCheck", "GroupBase", "RunFn"]

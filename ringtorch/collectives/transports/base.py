"""The contract of a transport: what the backend calls to run one collective on bytes."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ringtorch.collectives.call import CollectiveCall
from ringtorch.collectives.lowering import PostStep
from ringtorch.collectives.reduce_op import ByteReducer


class Transport(Protocol):
    """One group's way of running collectives on bytes.

    Every method runs one collective to completion on the calling thread, or raises
    (FrameMismatch, PeerClosedError, ShmPeerError, DistBackendError: the backend turns them
    into the group's abort and the user's error). ``call.deadline`` bounds every wait.

    Attributes:
        uses_shm: whether collectives go through shared memory.
        shares_memory: whether ``shared_buffer`` can allocate (one host's shared memory).
        description: what the group uses, in words (for tests and for performance work).
    """

    uses_shm: bool
    shares_memory: bool
    description: str

    def socket_deadline(self, call: CollectiveCall) -> float:
        """When a socket wait of ``call`` gives up (the hierarchy adds a grace period)."""

    def all_reduce(self, call: CollectiveCall, data: np.ndarray, reducer: ByteReducer,
                   itemsize: int, post: PostStep | None) -> None:
        """Reduce ``data`` in place on every rank; apply ``post`` once to every element of
        the result."""

    def broadcast(self, call: CollectiveCall, data: np.ndarray, itemsize: int) -> None:
        """``call.root``'s ``data`` into every rank's ``data``."""

    def reduce(self, call: CollectiveCall, data: np.ndarray, reducer: ByteReducer,
               itemsize: int) -> None:
        """The reduction of every rank's ``data`` into ``call.root``'s."""

    def all_gather(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray,
                   itemsize: int) -> None:
        """Every rank's ``inp`` into every rank's ``out``, in rank order."""

    def gather(self, call: CollectiveCall, out: np.ndarray | None, inp: np.ndarray,
               itemsize: int) -> None:
        """Every rank's ``inp`` into the root's ``out`` (None elsewhere)."""

    def scatter(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray | None,
                itemsize: int) -> None:
        """Slice r of the root's ``inp`` (None elsewhere) into rank r's ``out``."""

    def reduce_scatter(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray,
                       reducer: ByteReducer, itemsize: int) -> None:
        """Slice r of the reduction of every rank's ``inp`` into rank r's ``out``; ``inp`` is
        only read (it is the caller's tensor) and does not overlap ``out``."""

    def all_to_all(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray,
                   out_offsets: list[int], in_offsets: list[int]) -> None:
        """Block j of ``inp`` to rank j; block j of ``out`` from rank j (byte offsets)."""

    def barrier(self, call: CollectiveCall) -> None:
        """Return once every rank has entered."""

    def shared_buffer(self, call: CollectiveCall) -> tuple[int, np.ndarray] | None:
        """Collective: a buffer of ``call.nbytes`` in shared memory, as (index, uint8 view),
        or None where the transport has none (on every rank alike)."""

    def abort(self, reason: str) -> None:
        """Tell the peers through the transport's own medium, if it has one."""

    def close(self) -> None:
        """Release what the transport holds (not the mesh: the backend owns it)."""


__all__ = ["Transport"]

"""The shared-memory transport of a group whose ranks share one host, with a socket fallback.

all_reduce, reduce_scatter, all_gather, broadcast, reduce, gather, scatter and barrier run
through shared memory (algorithms/shm/); all_to_all (whose splits differ per rank) runs on the
composed SocketTransport, after publishing its call in the segment so that a peer waiting in
shared memory sees at once that this rank is elsewhere. Point-to-point messages never come
here (the backend's mailbox carries them).

Failures: the domain polls the group's AbortState while it waits (a peer's death seen first
on the sockets ends a shared-memory wait within a millisecond or so), waits on it, bounded,
for the real culprit when a peer left, and reports its own failures through ``on_failure``
(the backend aborts the group with them). Messages come from reports.ShmWords.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ringtorch._wire.shm_domain import ShmDomain
from ringtorch.collectives.abort import AbortState
from ringtorch.collectives.algorithms.shm import copy as shm_copy
from ringtorch.collectives.algorithms.shm import reduce as shm_reduce
from ringtorch.collectives.algorithms.shm.shared import SharedBuffers
from ringtorch.collectives.algorithms.shm.space import ShmSpace
from ringtorch.collectives.call import SHARED_SHIFT, CollectiveCall
from ringtorch.collectives.lowering import PostStep
from ringtorch.collectives.reduce_op import ByteReducer
from ringtorch.collectives.transports.sockets import SocketTransport


def attach(domain: ShmDomain, abort: AbortState, on_failure: Callable[[str], None]) -> ShmSpace:
    """The slot space over ``domain``, its failure hooks wired to the group's abort."""
    domain.poll_failure = lambda: abort.cause
    domain.await_failure = abort.wait
    domain.on_failure = on_failure
    return ShmSpace(domain, domain.settings["chunk"], domain.settings["oneshot"])


class ShmTransport:
    """Collectives through one host's shared memory (see the module docstring).

    Attributes:
        space: the slot space the shm algorithms run in.
        sockets: the socket transport for what shared memory does not do.
        description: what the group uses, in words.
    """

    uses_shm = True
    shares_memory = True

    def __init__(self, space: ShmSpace, sockets: SocketTransport) -> None:
        self.space = space
        self.sockets = sockets
        self.rank, self.size = sockets.rank, sockets.size
        self.shared = SharedBuffers(space.domain)
        self.description = f"1 host: ranks {list(range(self.size))} through shared memory"

    def socket_deadline(self, call: CollectiveCall) -> float:
        """See SocketTransport."""
        return call.deadline

    def all_reduce(self, call: CollectiveCall, data: np.ndarray, reducer: ByteReducer,
                   itemsize: int, post: PostStep | None) -> None:
        """See SocketTransport; ``post`` is applied slice by slice as slices are reduced."""
        if call.detail >> SHARED_SHIFT:  # on a shared buffer: no copy in
            self.shared.all_reduce(call.shared, reducer, itemsize, call, call.deadline)
            if post is not None:
                post(data)
            return
        shm_reduce.all_reduce(self.space, data, reducer, itemsize, call, call.deadline, post)

    def broadcast(self, call: CollectiveCall, data: np.ndarray, itemsize: int) -> None:
        """See SocketTransport."""
        shm_copy.broadcast(self.space, data, call.root, itemsize, call, call.deadline)

    def reduce(self, call: CollectiveCall, data: np.ndarray, reducer: ByteReducer,
               itemsize: int) -> None:
        """See SocketTransport. Only the root reduces, so the root's op is the one applied
        and the others' is not compared (torch's gloo does the same)."""
        call = call.without_redop()
        shm_reduce.reduce(self.space, data, reducer, call.root, itemsize, call, call.deadline)

    def all_gather(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray,
                   itemsize: int) -> None:
        """See SocketTransport."""
        shm_copy.all_gather(self.space, out, inp, itemsize, call, call.deadline)

    def all_gather_parts(self, call: CollectiveCall, outs: list[np.ndarray], inp: np.ndarray,
                         itemsize: int) -> None:
        """all_gather with rank j's part landing in ``outs[j]`` (no scratch buffer)."""
        shm_copy.all_gather_parts(self.space, outs, inp, itemsize, call, call.deadline)

    def gather(self, call: CollectiveCall, out: np.ndarray | None, inp: np.ndarray,
               itemsize: int) -> None:
        """See SocketTransport."""
        shm_copy.gather(self.space, out, inp, call.root, itemsize, call, call.deadline)

    def scatter(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray | None,
                itemsize: int) -> None:
        """See SocketTransport."""
        shm_copy.scatter(self.space, out, inp, call.root, itemsize, call, call.deadline)

    def reduce_scatter(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray,
                       reducer: ByteReducer, itemsize: int) -> None:
        """See SocketTransport."""
        shm_reduce.reduce_scatter(self.space, out, inp, reducer, itemsize, call, call.deadline)

    def reduce_scatter_parts(self, call: CollectiveCall, out: np.ndarray, ins: list[np.ndarray],
                             reducer: ByteReducer, itemsize: int) -> None:
        """reduce_scatter with rank j's piece read from ``ins[j]`` (no concatenation)."""
        shm_reduce.reduce_scatter_parts(self.space, out, ins, reducer, itemsize, call,
                                        call.deadline)

    def all_to_all(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray,
                   out_offsets: list[int], in_offsets: list[int]) -> None:
        """On the sockets, published in the segment first."""
        self.space.domain.enter(call)
        self.sockets.all_to_all(call, out, inp, out_offsets, in_offsets)

    def barrier(self, call: CollectiveCall) -> None:
        """See SocketTransport."""
        shm_copy.barrier(self.space, call, call.deadline)

    # -- shared buffers and lifetime ------------------------------------------------------------

    def shared_buffer(self, call: CollectiveCall) -> tuple[int, np.ndarray] | None:
        """Collective: a new buffer of ``call.nbytes`` in every rank's shared memory, as
        (index, this rank's zero-filled uint8 view), or None on every rank when some rank
        could not get the memory (shm/shared.py)."""
        return self.shared.allocate(call.nbytes, call, call.deadline)

    def abort(self, reason: str) -> None:
        """Tell the peers through the segment (they see it within a millisecond)."""
        self.space.domain.abort(reason)

    def close(self) -> None:
        """Unmap the shared buffers and the segments."""
        self.shared.close()
        self.space.close()
        self.space.domain.close()


__all__ = ["ShmTransport", "attach"]

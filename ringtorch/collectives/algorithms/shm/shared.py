"""Buffers that live in the group's shared memory, and the all_reduce that needs no copy in.

``SharedBuffers.allocate`` is collective: every rank of the group calls it with the same size
in the same place of its sequence of collectives. Each rank creates a segment of its own
(shm.py: locked, reserved, mode 0600), publishes its name in its header, and after one round
maps every peer's; after a second round (everyone has mapped everything) the creator unlinks
the name, so the memory lives exactly as long as the mappings (G1). Rank r's buffer number k
is then readable by every peer, at the same index on every rank.

``all_reduce`` on such a buffer (the whole of it) moves every byte once, with three rounds:

1. round: every rank's buffer holds its input;
2. rank r reduces slice r in place from every rank's buffer (ranks 0 and 1 straight into
   their buffer, ranks 2+ from a private copy of their own slice: the reduction stays left to
   right in rank order, so every rank gets the same bits); round;
3. rank r copies every other slice j from its reducer's buffer (rank j's); round, so nobody
   returns, and perhaps writes its buffer, while a peer still reads it.

Against the copy-in algorithms (shm_reduce.py) this saves copying the message in and, at
world 2, half of the copying out: per rank ~N/p reduced + N(p-1)/p copied instead of ~2N.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import numpy as np

from ringtorch._wire.shm import Segment
from ringtorch._wire.shm_domain import Descriptor, ShmDomain
from ringtorch.collectives.algorithms.shm.plan import split_bytes
from ringtorch.collectives.algorithms.shm.space import reduce_in_rank_order
from ringtorch.collectives.reduce_op import ByteReducer


class _Shared(NamedTuple):
    nbytes: int
    segments: list[Segment]  # rank j's segment at j (this rank's own at its rank)
    views: list[np.ndarray]  # uint8 views of the buffers, nbytes long


class SharedBuffers:
    """The shared buffers of one group, in allocation order (the same on every rank)."""

    def __init__(self, domain: ShmDomain) -> None:
        self.domain = domain
        self._buffers: list[_Shared] = []

    def __len__(self) -> int:
        return len(self._buffers)

    def allocate(self, nbytes: int, desc: Descriptor, deadline: float) -> tuple[int, np.ndarray] | None:
        """Collective: a new buffer of ``nbytes`` in every rank's shared memory; returns
        (its index, this rank's uint8 view of it, zero-filled), or None on every rank when
        some rank could not get the memory.

        Raises:
            ShmPeerError: a peer died, aborted, is in another collective or is late.
        """
        d = self.domain
        own: Segment | None = None
        with contextlib.suppress(OSError):  # /dev/shm full: published as "" below
            own = Segment.create(max(nbytes, 1))
        try:
            d.publish_name(own.name if own is not None else "")
            d.arrive(desc, deadline)
            names = {j: d.peer_name(j) for j in d.peers}
            if own is None or not all(names.values()):
                if own is not None:
                    own.close()
                return None  # every rank read the same names, so every rank gives up alike
            segments: list[Segment] = []
            for j in range(d.size):
                try:
                    segments.append(own if j == d.rank else Segment.attach(names[j]))
                except (OSError, ValueError) as exc:
                    for seg in segments[:j]:
                        if seg is not own:
                            seg.close()
                    d.fail(f"rank {d.rank} could not map rank {j}'s shared buffer: {exc}", [j])
            d.step(desc, deadline)
        except BaseException:
            if own is not None:
                own.close()
            raise
        own.unlink()  # every rank has mapped it: the memory now lives as long as the mappings
        views = [np.frombuffer(seg.buf, np.uint8, nbytes, 0) for seg in segments]
        self._buffers.append(_Shared(nbytes, segments, views))
        return len(self._buffers) - 1, views[d.rank]

    def all_reduce(self, index: int, reduce: ByteReducer, itemsize: int, desc: Descriptor,
                   deadline: float) -> None:
        """Collective: reduce buffer ``index`` across ranks, in place on every rank."""
        d = self.domain
        r, p = d.rank, d.size
        buffers = self._buffers[index].views
        mine = buffers[r]
        slices = split_bytes(mine.nbytes, p, itemsize)
        d.arrive(desc, deadline)
        # every rank's input is in its buffer; rank r reduces slice r and writes only that
        s0, s1 = slices[r]
        operands = [buffers[j][s0:s1] for j in range(p)]
        if r >= 2:
            operands[r] = operands[r].copy()  # the accumulator starts from rank 0's operand
        reduce_in_rank_order(mine[s0:s1], operands, r, reduce)
        d.step(desc, deadline)
        # slice j is reduced in rank j's buffer
        for j, (a, b) in enumerate(slices):
            if j != r:
                np.copyto(mine[a:b], buffers[j][a:b])
        d.step(desc, deadline)  # nobody reads this rank's buffer any more

    def close(self) -> None:
        """Unmap every buffer (a view still held keeps its memory until it is dropped)."""
        for shared in self._buffers:
            for seg in shared.segments:
                seg.close()
        self._buffers.clear()


__all__ = ["SharedBuffers"]

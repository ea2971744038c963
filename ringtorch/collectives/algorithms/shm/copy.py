"""Broadcast, all_gather, gather, scatter and barrier through shared memory: copy in, one
round, copy out.

A message larger than a round's chunk goes through the two data slots chunk by chunk: while
the readers copy chunk c out of one slot, the writers already copy chunk c + 1 into the other
(shm_domain.py's round rules make that safe), so copying overlaps across ranks. Each rank
copies its own data straight from its private buffer, between its signal and its wait where it
can; only what a peer needs goes through shared memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from ringtorch._wire.shm_domain import Descriptor
from ringtorch.collectives.algorithms.shm.space import ShmSpace


def broadcast(space: ShmSpace, buf: np.ndarray, root: int, itemsize: int, desc: Descriptor,
              deadline: float) -> None:
    """Copy root's ``buf`` (uint8) into every rank's ``buf``."""
    steps = space.plan("broadcast", buf.nbytes, itemsize, desc, deadline)
    r = space.rank
    for i, (a, b) in enumerate(steps.chunks):
        base = space.next_area(steps)
        if r == root:
            np.copyto(space.view(r, base, b - a), buf[a:b])
        space.round(i == 0, desc, deadline)
        # after the round root's chunk is in its slot until round + 2
        if r != root:
            np.copyto(buf[a:b], space.view(root, base, b - a))


def all_gather(space: ShmSpace, out: np.ndarray, inp: np.ndarray, itemsize: int, desc: Descriptor,
               deadline: float) -> None:
    """``out`` (size * inp.nbytes, uint8) receives every rank's ``inp`` in rank order."""
    m = inp.nbytes
    all_gather_parts(space, [out[j * m:(j + 1) * m] for j in range(space.size)], inp, itemsize,
                     desc, deadline, np.may_share_memory(out, inp))


def all_gather_parts(space: ShmSpace, outs: Sequence[np.ndarray], inp: np.ndarray, itemsize: int,
                     desc: Descriptor, deadline: float, overlap: bool | None = None) -> None:
    """``outs[j]`` (uint8, inp's size) receives rank j's ``inp``. ``overlap``: whether any
    part may share memory with ``inp`` (None: find out here).

    Per chunk: copy it into this rank's slot, signal, copy it into this rank's own part
    while the peers arrive (it is still in cache), wait, then copy every peer's chunk straight
    from the peer's slot into its part. An ``inp`` that is this rank's part already (the
    in-place all_gather FSDP uses) is not copied into it at all.
    """
    m = inp.nbytes
    steps = space.plan("all_gather", m, itemsize, desc, deadline)
    r = space.rank
    own = outs[r]
    in_place = False
    if overlap is None:
        overlap = any(np.may_share_memory(o, inp) for o in outs)
    if overlap:
        in_place = _same_memory(own, inp)
        if not in_place:  # overlapping elsewhere: our writes would reach what we still send
            inp = inp.copy()
    peers = [(j, o) for j, o in enumerate(outs) if j != r]
    for i, (a, b) in enumerate(steps.chunks):
        base = space.next_area(steps)
        np.copyto(space.view(r, base, b - a), inp[a:b])
        keep = None if in_place else partial(np.copyto, own[a:b], inp[a:b])
        space.round(i == 0, desc, deadline, keep)
        # after the round every rank's chunk [a, b) is in its slot
        for j, o in peers:
            np.copyto(o[a:b], space.view(j, base, b - a))


def _same_memory(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two contiguous byte arrays are the very same memory."""
    return (x.nbytes == y.nbytes
            and x.__array_interface__["data"][0] == y.__array_interface__["data"][0])


def gather(space: ShmSpace, out: np.ndarray | None, inp: np.ndarray, root: int, itemsize: int,
           desc: Descriptor, deadline: float) -> None:
    """Root's ``out`` (size * inp.nbytes, uint8) receives every rank's ``inp`` in rank order;
    the others pass ``out`` None."""
    m = inp.nbytes
    steps = space.plan("gather", m, itemsize, desc, deadline)
    r, p = space.rank, space.size
    if r == root:
        assert out is not None
        np.copyto(out[r * m:(r + 1) * m], inp)
    for i, (a, b) in enumerate(steps.chunks):
        base = space.next_area(steps)
        if r != root:
            np.copyto(space.view(r, base, b - a), inp[a:b])
        space.round(i == 0, desc, deadline)
        # after the round every non-root's chunk [a, b) is in its slot until round + 2
        if r == root:
            assert out is not None
            for j in range(p):
                if j != r:
                    np.copyto(out[j * m + a:j * m + b], space.view(j, base, b - a))


def scatter(space: ShmSpace, out: np.ndarray, inp: np.ndarray | None, root: int, itemsize: int,
            desc: Descriptor, deadline: float) -> None:
    """Rank r's ``out`` (uint8) receives piece r of root's ``inp`` (size pieces of
    ``out.nbytes``); the others pass ``inp`` None. A round's slot holds one chunk of every
    piece, as reduce_scatter's does."""
    m, r, p = out.nbytes, space.rank, space.size
    steps = space.plan("scatter", p * m, itemsize, desc, deadline)
    c = steps.chunk_nbytes
    if r == root:
        assert inp is not None
        np.copyto(out, inp[r * m:(r + 1) * m])
    for i, (a, b) in enumerate(steps.chunks):
        base = space.next_area(steps)
        if r == root:
            assert inp is not None
            for d in range(p):
                if d != r:
                    np.copyto(space.view(r, base + d * c, b - a), inp[d * m + a:d * m + b])
        space.round(i == 0, desc, deadline)
        if r != root:
            np.copyto(out[a:b], space.view(root, base + r * c, b - a))


def barrier(space: ShmSpace, desc: Descriptor, deadline: float) -> None:
    """Return once every rank has entered the barrier (one round)."""
    space.domain.arrive(desc, deadline)


__all__ = ["all_gather", "all_gather_parts", "barrier", "broadcast", "gather", "scatter"]

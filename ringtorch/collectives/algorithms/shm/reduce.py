"""all_reduce, reduce and reduce_scatter through shared memory, reduced straight from the
peers' segments.

* all_reduce, small (one-shot): each rank copies its buffer into its slot, one round, then
  every rank reduces all the slots into its own buffer. One round per call.
* all_reduce, large (staged, DeepSpeed's and gloo-shm's design): per chunk, each rank copies
  the chunk into its slot, one round, rank r reduces slice r of the chunk from every slot into
  its slot's result area; in the next round everyone copies all reduced slices out. The copy
  of chunk c + 1 and the reduction of chunk c happen in the same round, so copying and
  reducing overlap across ranks: one round per chunk, plus one to collect the last.
* reduce_scatter: per chunk, each rank copies in the pieces destined for the others, one round,
  rank r reduces its piece from every slot straight into its output (no copy out).
* reduce: per chunk, the non-roots copy in, one round, the root reduces into its buffer.

Every reduction is computed left to right in rank order (space.reduce_in_rank_order), once
per element, so results are bitwise identical on every rank. Reductions arrive lowered
(lowering.py): a base op, plus for all_reduce an optional post step (AVG's division) applied
here to each reduced slice once, while it is still in cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ringtorch._wire.shm_domain import Descriptor
from ringtorch.collectives.algorithms.shm.plan import Plan, split_bytes
from ringtorch.collectives.algorithms.shm.space import ShmSpace, reduce_in_rank_order
from ringtorch.collectives.reduce_op import ByteReducer


def all_reduce(space: ShmSpace, buf: np.ndarray, reduce: ByteReducer, itemsize: int,
               desc: Descriptor, deadline: float,
               post: Callable[[np.ndarray], None] | None = None) -> None:
    """Reduce ``buf`` (uint8) across ranks, in place on every rank.

    ``post``, when given, is applied in place to every reduced element exactly once, before
    anyone copies it (AVG's division: in the staged plan each slice is divided by the rank
    that reduced it, while it is still in cache, instead of in a pass over the whole buffer
    afterwards on every rank)."""
    steps = space.plan("all_reduce", buf.nbytes, itemsize, desc, deadline)
    if steps.oneshot:
        _all_reduce_oneshot(space, buf, reduce, steps, desc, deadline)
        if post is not None:
            post(buf)
    else:
        _all_reduce_staged(space, buf, reduce, itemsize, steps.chunks, steps.chunk_nbytes,
                           desc, deadline, post)


def _all_reduce_oneshot(space: ShmSpace, buf: np.ndarray, reduce: ByteReducer, steps: Plan,
                        desc: Descriptor, deadline: float) -> None:
    r, p, n = space.rank, space.size, buf.nbytes
    base = space.next_area(steps)
    np.copyto(space.view(r, base, n), buf)
    space.domain.arrive(desc, deadline)
    # every rank's buffer is in its slot until round + 2; everyone reduces all of them
    reduce_in_rank_order(buf, [space.view(j, base, n) for j in range(p)], r, reduce)


def _all_reduce_staged(space: ShmSpace, buf: np.ndarray, reduce: ByteReducer, itemsize: int,
                       chunks: tuple[tuple[int, int], ...], chunk_nbytes: int, desc: Descriptor,
                       deadline: float, post: Callable[[np.ndarray], None] | None) -> None:
    r, p = space.rank, space.size
    # ranks 0 and 1 reduce their slice in place in their buffer (their own operand can be
    # the left-to-right reduction's accumulator) and then publish it; the others reduce into
    # the result area and copy their slice back from there with the peers' slices
    in_place = r <= 1
    pending: tuple[int, int, int] | None = None  # (start, stop, slot) of the chunk to collect
    for i, (a, b) in enumerate(chunks):
        base = space.next_slot()
        slices = split_bytes(b - a, p, itemsize)
        s0, s1 = slices[r]
        mine = space.view(r, base, b - a)
        # only slices the peers reduce go through shared memory; slice r stays private
        np.copyto(mine[:s0], buf[a:a + s0])
        np.copyto(mine[s1:], buf[a + s1:b])
        space.round(i == 0, desc, deadline)
        # every rank's chunk is in its slot: reduce slice r into this slot's result area
        out = space.view(r, base + chunk_nbytes + s0, s1 - s0)
        own = buf[a + s0:a + s1]
        operands = [own if j == r else space.view(j, base + s0, s1 - s0) for j in range(p)]
        if in_place:
            reduce_in_rank_order(own, operands, r, reduce)
            if post is not None:
                post(own)
            np.copyto(out, own)
        else:
            reduce_in_rank_order(out, operands, -1, reduce)
            if post is not None:
                post(out)
        if pending is not None:
            _collect(space, buf, itemsize, pending, chunk_nbytes, in_place)
        pending = (a, b, base)
    space.domain.step(desc, deadline)
    # every slice of the last chunk is reduced
    assert pending is not None
    _collect(space, buf, itemsize, pending, chunk_nbytes, in_place)
    # peers may still collect from this round's slot: the next collective writes the other
    space.domain.skip_round()


def _collect(space: ShmSpace, buf: np.ndarray, itemsize: int, chunk: tuple[int, int, int],
             chunk_nbytes: int, skip_own: bool) -> None:
    """Copy every reduced slice of a chunk (reduced a round ago) into ``buf``."""
    a, b, base = chunk
    r = space.rank
    for j, (s0, s1) in enumerate(split_bytes(b - a, space.size, itemsize)):
        if j != r or not skip_own:
            np.copyto(buf[a + s0:a + s1], space.view(j, base + chunk_nbytes + s0, s1 - s0))


def reduce_scatter(space: ShmSpace, out: np.ndarray, inp: np.ndarray, reduce: ByteReducer,
                   itemsize: int, desc: Descriptor, deadline: float) -> None:
    """Rank r's ``out`` receives the reduction over ranks of piece r of ``inp`` (uint8;
    ``inp`` holds ``size`` pieces of ``out.nbytes``)."""
    m = out.nbytes
    reduce_scatter_parts(space, out, [inp[d * m:(d + 1) * m] for d in range(space.size)],
                         reduce, itemsize, desc, deadline)


def reduce_scatter_parts(space: ShmSpace, out: np.ndarray, ins: Sequence[np.ndarray],
                         reduce: ByteReducer, itemsize: int, desc: Descriptor,
                         deadline: float) -> None:
    """Rank r's ``out`` receives the reduction over ranks of their ``ins[r]`` (uint8, each
    of out's size, only read; none overlaps ``out``). Per chunk: copy the pieces destined
    for the peers into this rank's slot, one round, then reduce piece r straight from the
    peers' slots and this rank's own piece into ``out``: one pass when two ranks take part."""
    r, p, m = space.rank, space.size, out.nbytes
    steps = space.plan("reduce_scatter", p * m, itemsize, desc, deadline)
    c = steps.chunk_nbytes
    others = [(d, ins[d]) for d in range(p) if d != r]
    own = ins[r]
    for i, (a, b) in enumerate(steps.chunks):
        base = space.next_area(steps)
        for d, piece in others:
            np.copyto(space.view(r, base + d * c, b - a), piece[a:b])
        space.round(i == 0, desc, deadline)
        # every rank's pieces of this chunk are in its slot: reduce piece r into out
        operands = [own[a:b] if j == r else space.view(j, base + r * c, b - a) for j in range(p)]
        reduce_in_rank_order(out[a:b], operands, -1, reduce)


def reduce(space: ShmSpace, buf: np.ndarray, reduce: ByteReducer, root: int, itemsize: int,
           desc: Descriptor, deadline: float) -> None:
    """Root's ``buf`` (uint8) receives the reduction over ranks; the others' stay as they were."""
    r, p = space.rank, space.size
    steps = space.plan("reduce", buf.nbytes, itemsize, desc, deadline)
    # a root of rank 2 or more overwrites its buffer with rank 0's chunk first, so it needs
    # its own operand in its slot like everyone else
    root_copies = root >= 2
    for i, (a, b) in enumerate(steps.chunks):
        base = space.next_slot()
        if r != root or root_copies:
            np.copyto(space.view(r, base, b - a), buf[a:b])
        space.round(i == 0, desc, deadline)
        if r == root:
            operands = [space.view(j, base, b - a) for j in range(p)]
            if not root_copies:
                operands[r] = buf[a:b]
            reduce_in_rank_order(buf[a:b], operands, r, reduce)


__all__ = ["all_reduce", "reduce", "reduce_scatter", "reduce_scatter_parts"]

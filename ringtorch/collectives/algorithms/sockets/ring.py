"""Ring all_reduce, reduce, reduce_scatter and all_gather: the bandwidth-optimal shapes.

Each rank sends only to its right neighbour and receives only from its left one. All-reduce
is a reduce-scatter (p-1 steps: a block travels round the ring, reduced once at every hop)
followed by an all-gather (p-1 steps: each finished block travels round again, copied). Per
rank that moves 2(p-1)/p of the buffer, the least any algorithm can. Large buffers are cut
into chunks of p * segment elements and the ring runs once per chunk, so the only scratch is
one segment (double-buffered for reduce_scatter), cache-sized, reused for every chunk.

Every block is reduced exactly once per hop in a fixed order and then copied, so every rank
ends with bitwise-identical results.
"""

from __future__ import annotations

import numpy as np

from ringtorch.collectives.algorithms.chunking import (
    elements_per,
    pipeline_chunks,
    segments,
    split_even,
)
from ringtorch.collectives.algorithms.sockets.link import Link
from ringtorch.collectives.reduce_op import ByteReducer


def _reduce_scatter_chunk(link: Link, buf: np.ndarray, blocks: list[tuple[int, int]],
                          scratch: np.ndarray, reduce: ByteReducer) -> None:
    r, p = link.rank, link.size
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        a, b = blocks[(r - step) % p]
        c, d = blocks[(r - step - 1) % p]
        incoming = scratch[:d - c]
        link.exchange([(right, buf[a:b])], [(left, incoming)])
        reduce(buf[c:d], incoming, False)


def _byte_blocks(c0: int, c1: int, p: int, itemsize: int) -> list[tuple[int, int]]:
    return [((c0 + a) * itemsize, (c0 + b) * itemsize) for a, b in split_even(c1 - c0, p)]


def all_reduce(link: Link, buf: np.ndarray, reduce: ByteReducer, itemsize: int,
               segment_nbytes: int) -> None:
    """In-place ring all_reduce of ``buf`` (bytes of ``itemsize``-byte elements)."""
    r, p = link.rank, link.size
    right, left = (r + 1) % p, (r - 1) % p
    seg = elements_per(segment_nbytes, itemsize)
    scratch = link.scratch(seg * itemsize)
    for c0, c1 in pipeline_chunks(buf.nbytes // itemsize, p, seg):
        blocks = _byte_blocks(c0, c1, p, itemsize)
        # reduce-scatter: afterwards rank r holds the full reduction of block (r + 1) % p
        _reduce_scatter_chunk(link, buf, blocks, scratch, reduce)
        # all-gather: afterwards every rank holds every reduced block
        for step in range(p - 1):
            a, b = blocks[(r + 1 - step) % p]
            c, d = blocks[(r - step) % p]
            link.exchange([(right, buf[a:b])], [(left, buf[c:d])])


def reduce(link: Link, buf: np.ndarray, root: int, reduce: ByteReducer, itemsize: int,
           segment_nbytes: int) -> None:
    """Ring reduce-scatter, then every rank sends its finished block to ``root``. Only root's
    ``buf`` holds the result; the others' hold partial reductions afterwards."""
    r, p = link.rank, link.size
    seg = elements_per(segment_nbytes, itemsize)
    scratch = link.scratch(seg * itemsize)
    for c0, c1 in pipeline_chunks(buf.nbytes // itemsize, p, seg):
        blocks = _byte_blocks(c0, c1, p, itemsize)
        _reduce_scatter_chunk(link, buf, blocks, scratch, reduce)
        # gather: rank q owns block (q + 1) % p; root collects the others' blocks
        if r != root:
            a, b = blocks[(r + 1) % p]
            link.send(root, buf[a:b])
        else:
            recvs = []
            for q in range(p):
                if q != root:
                    a, b = blocks[(q + 1) % p]
                    recvs.append((q, buf[a:b]))
            link.exchange((), recvs)


def reduce_scatter(link: Link, out: np.ndarray, inp: np.ndarray, reduce: ByteReducer,
                   itemsize: int, segment_nbytes: int) -> None:
    """Ring reduce-scatter: ``inp`` is p blocks of ``out``'s size; rank r gets block r reduced.
    ``inp`` is only read; partial sums live in two scratch segments and the last hop lands in
    ``out``."""
    r, p = link.rank, link.size
    if p == 1:
        out[:] = inp
        return
    right, left = (r + 1) % p, (r - 1) % p
    m = out.nbytes // itemsize
    seg = elements_per(segment_nbytes, itemsize)
    scratch = link.scratch(3 * seg * itemsize)
    halves = (scratch[:seg * itemsize], scratch[seg * itemsize:2 * seg * itemsize])
    # when out is a view into inp (in-place use), the last hop must not land on the input
    # it still has to add: it lands in a third scratch segment and is copied afterwards
    aliased = np.may_share_memory(out, inp)
    landing = scratch[2 * seg * itemsize:]
    for s0, s1 in segments(0, m, seg):
        lo, hi = s0 * itemsize, s1 * itemsize

        def block(j: int, lo: int = lo, hi: int = hi) -> np.ndarray:
            base = (j % p) * m * itemsize
            return inp[base + lo:base + hi]

        outgoing = block(r - 1)
        for step in range(p - 1):
            # this hop adds this rank's part of block (r - step - 2) to the partial from the left
            last = step == p - 2
            if not last:
                incoming = halves[step % 2][:hi - lo]
            else:
                incoming = landing[:hi - lo] if aliased else out[lo:hi]
            link.exchange([(right, outgoing)], [(left, incoming)])
            reduce(incoming, block(r - step - 2), True)
            outgoing = incoming
        if aliased:
            out[lo:hi] = landing[:hi - lo]


def all_gather(link: Link, out: np.ndarray, inp: np.ndarray) -> None:
    """Ring all-gather: block p of ``out`` receives rank p's ``inp``."""
    r, p = link.rank, link.size
    right, left = (r + 1) % p, (r - 1) % p
    m = inp.nbytes
    out[r * m:(r + 1) * m] = inp
    for step in range(p - 1):
        a = ((r - step) % p) * m
        c = ((r - step - 1) % p) * m
        link.exchange([(right, out[a:a + m])], [(left, out[c:c + m])])


__all__ = ["all_gather", "all_reduce", "reduce", "reduce_scatter"]

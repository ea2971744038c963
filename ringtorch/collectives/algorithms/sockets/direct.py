"""Direct algorithms: every rank talks to every rank it needs in one exchange.

One round, p-1 frames per rank: the fewest round trips, so the choice for small messages and
small groups, and the only shape gather, scatter and all_to_all have. Reductions are done in
rank order (x0 (op) x1 (op) ... (op) x(p-1)) on every rank, so every rank computes
bitwise-identical results whatever the floating-point rounding.
"""

from __future__ import annotations

import numpy as np

from ringtorch.collectives.algorithms.chunking import elements_per, pipeline_chunks, split_even
from ringtorch.collectives.algorithms.sockets.link import Link
from ringtorch.collectives.reduce_op import ByteReducer


def _peers(link: Link) -> list[int]:
    return [p for p in range(link.size) if p != link.rank]


def _reduce_in_rank_order(link: Link, own: np.ndarray, slot: dict[int, np.ndarray],
                          reduce: ByteReducer) -> None:
    """own := x0 (op) x1 (op) ... with own = x(rank) and slot[p] = x(p) for the others."""
    r = link.rank
    if r > 0:
        acc = slot[0]
        for p in range(1, r):
            reduce(acc, slot[p], False)
        reduce(own, acc, True)
    for p in range(r + 1, link.size):
        reduce(own, slot[p], False)


def all_reduce(link: Link, buf: np.ndarray, reduce: ByteReducer, itemsize: int = 1,
               segment_nbytes: int = 0) -> None:
    """Everyone sends its buffer to everyone and reduces all of them, in rank order."""
    peers = _peers(link)
    n = buf.nbytes
    scratch = link.scratch(n * len(peers))
    slot = {p: scratch[i * n:(i + 1) * n] for i, p in enumerate(peers)}
    # afterwards slot[p] holds rank p's buffer
    link.exchange([(p, buf) for p in peers], [(p, slot[p]) for p in peers])
    _reduce_in_rank_order(link, buf, slot, reduce)


def all_reduce_scatter_gather(link: Link, buf: np.ndarray, reduce: ByteReducer, itemsize: int,
                              segment_nbytes: int) -> None:
    """Large all_reduce in two direct rounds per chunk: every rank sends block q to rank q,
    which reduces it (rank order) and sends it back to everyone. The same bytes move as in
    the ring (2(p-1)/p of the buffer per rank) but in 2 rounds per chunk instead of 2(p-1),
    with every stream busy at once: better when ranks share cores and each ring hop would
    wait for a descheduled neighbour."""
    peers = _peers(link)
    r, p = link.rank, link.size
    seg = elements_per(segment_nbytes, itemsize)
    scratch = link.scratch(max(1, p - 1) * seg * itemsize)
    for c0, c1 in pipeline_chunks(buf.nbytes // itemsize, p, seg):
        blocks = [((c0 + a) * itemsize, (c0 + b) * itemsize) for a, b in split_even(c1 - c0, p)]
        a, b = blocks[r]
        own = buf[a:b]
        slot = {q: scratch[i * (b - a):(i + 1) * (b - a)] for i, q in enumerate(peers)}
        # reduce-scatter: afterwards block r of this rank holds the reduction over all ranks
        link.exchange([(q, buf[blocks[q][0]:blocks[q][1]]) for q in peers],
                      [(q, slot[q]) for q in peers])
        _reduce_in_rank_order(link, own, slot, reduce)
        # all-gather: afterwards every block is final everywhere
        link.exchange([(q, own) for q in peers],
                      [(q, buf[blocks[q][0]:blocks[q][1]]) for q in peers])


def reduce(link: Link, buf: np.ndarray, root: int, reduce: ByteReducer, itemsize: int = 1,
           segment_nbytes: int = 0) -> None:
    """Everyone sends to root; root reduces in rank order."""
    if link.rank != root:
        link.send(root, buf)
        return
    peers = _peers(link)
    n = buf.nbytes
    scratch = link.scratch(n * len(peers))
    slot = {p: scratch[i * n:(i + 1) * n] for i, p in enumerate(peers)}
    link.exchange((), [(p, slot[p]) for p in peers])
    _reduce_in_rank_order(link, buf, slot, reduce)


def reduce_scatter(link: Link, out: np.ndarray, inp: np.ndarray, reduce: ByteReducer,
                   itemsize: int = 1, segment_nbytes: int = 0) -> None:
    """Rank r sends block j of its input to rank j and reduces the blocks r it receives."""
    peers = _peers(link)
    m = out.nbytes
    scratch = link.scratch(m * len(peers))
    slot = {p: scratch[i * m:(i + 1) * m] for i, p in enumerate(peers)}
    link.exchange([(p, inp[p * m:(p + 1) * m]) for p in peers], [(p, slot[p]) for p in peers])
    r = link.rank
    out[:] = inp[r * m:(r + 1) * m]
    _reduce_in_rank_order(link, out, slot, reduce)


def all_gather(link: Link, out: np.ndarray, inp: np.ndarray) -> None:
    """Everyone sends its input to everyone; block p of ``out`` receives rank p's input."""
    peers = _peers(link)
    m = inp.nbytes
    r = link.rank
    own = out[r * m:(r + 1) * m]
    if own.ctypes.data != inp.ctypes.data or m == 0:
        own[:] = inp
    link.exchange([(p, inp) for p in peers], [(p, out[p * m:(p + 1) * m]) for p in peers])


def gather(link: Link, out: np.ndarray | None, inp: np.ndarray, root: int) -> None:
    """Everyone sends to root; root's ``out`` block p receives rank p's input."""
    if link.rank != root:
        link.send(root, inp)
        return
    assert out is not None
    m = inp.nbytes
    out[root * m:(root + 1) * m] = inp
    link.exchange((), [(p, out[p * m:(p + 1) * m]) for p in _peers(link)])


def scatter(link: Link, out: np.ndarray, inp: np.ndarray | None, root: int) -> None:
    """Root sends block p of its input to rank p."""
    if link.rank != root:
        link.recv(root, out)
        return
    assert inp is not None
    m = out.nbytes
    link.exchange([(p, inp[p * m:(p + 1) * m]) for p in _peers(link)], ())
    out[:] = inp[root * m:(root + 1) * m]


def all_to_all(link: Link, out: np.ndarray, inp: np.ndarray, out_offsets: list[int],
               in_offsets: list[int]) -> None:
    """Block j of ``inp`` goes to rank j; block j of ``out`` comes from rank j. Offsets are
    byte offsets with one extra entry at the end (block j is ``[off[j], off[j+1])``)."""
    r = link.rank
    peers = _peers(link)
    link.exchange([(p, inp[in_offsets[p]:in_offsets[p + 1]]) for p in peers],
                  [(p, out[out_offsets[p]:out_offsets[p + 1]]) for p in peers])
    out[out_offsets[r]:out_offsets[r + 1]] = inp[in_offsets[r]:in_offsets[r + 1]]


__all__ = ["all_gather", "all_reduce", "all_reduce_scatter_gather", "all_to_all", "gather", "reduce",
           "reduce_scatter",
           "scatter"]

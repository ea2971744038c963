"""Recursive doubling all_reduce and the dissemination barrier: log2(p) rounds of pairwise
exchanges, the latency-optimal shapes for small messages in larger groups.

For a world size that is not a power of two, the first 2*rem ranks (rem = p - 2^k) fold in
pairs before the doubling (the even rank hands its buffer to the odd one and waits) and get
the result back after it. In every exchange both partners compute ``lower (op) higher`` (the
lower rank's operand first), so the two partners hold the same bits after every round and
every rank ends bitwise identical.
"""

from __future__ import annotations

import numpy as np

from ringtorch.collectives.algorithms.chunking import power_of_two_below
from ringtorch.collectives.algorithms.sockets.link import Link
from ringtorch.collectives.reduce_op import ByteReducer


def all_reduce(link: Link, buf: np.ndarray, reduce: ByteReducer, itemsize: int = 1,
               segment_nbytes: int = 0) -> None:
    """In-place all_reduce of ``buf`` by recursive doubling (see the module docstring)."""
    r, p = link.rank, link.size
    p2 = power_of_two_below(p)
    rem = p - p2
    scratch = link.scratch(buf.nbytes)
    # fold: afterwards the odd rank of each of the first rem pairs holds the pair's reduction
    if r < 2 * rem:
        if r % 2 == 0:
            link.send(r + 1, buf)
            link.recv(r + 1, buf)
            return
        link.recv(r - 1, scratch)
        reduce(buf, scratch, True)
        vrank = r // 2
    else:
        vrank = r - rem
    # doubling: after the round with `mask`, each rank holds the reduction over its
    # 2*mask-aligned block of virtual ranks
    mask = 1
    while mask < p2:
        vpeer = vrank ^ mask
        peer = 2 * vpeer + 1 if vpeer < rem else vpeer + rem
        link.exchange([(peer, buf)], [(peer, scratch)])
        reduce(buf, scratch, peer < r)
        mask <<= 1
    # unfold: the even ranks of the folded pairs get the result
    if r < 2 * rem:
        link.send(r - 1, buf)


def barrier(link: Link) -> None:
    """Dissemination barrier: in round k rank r signals r + 2^k and waits for r - 2^k; after
    ceil(log2 p) rounds every rank has heard, transitively, from every other."""
    r, p = link.rank, link.size
    empty = np.empty(0, dtype=np.uint8)
    distance = 1
    while distance < p:
        link.exchange([((r + distance) % p, empty)], [((r - distance) % p, empty)])
        distance <<= 1


__all__ = ["all_reduce", "barrier"]

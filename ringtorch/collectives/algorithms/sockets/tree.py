"""Broadcast shapes: a binomial tree for small messages (log2(p) rounds) and a pipelined
chain for large ones (each rank forwards segment k while it receives segment k+1, so the
time approaches one buffer's transfer however many ranks there are).

Ranks are renumbered relative to the root (``vrank = (rank - root) % p``); the root is vrank 0.
"""

from __future__ import annotations

import numpy as np

from ringtorch.collectives.algorithms.chunking import elements_per, segments
from ringtorch.collectives.algorithms.sockets.link import Link


def broadcast_tree(link: Link, buf: np.ndarray, root: int, segment_nbytes: int = 0) -> None:
    """Binomial tree: a rank receives from the vrank with its lowest set bit cleared, then
    sends to vrank + 2^j for every 2^j below that bit."""
    r, p = link.rank, link.size
    vrank = (r - root) % p
    mask = 1
    while mask < p:
        if vrank & mask:
            link.recv((vrank - mask + root) % p, buf)
            break
        mask <<= 1
    # afterwards this rank has the data; forward it down its subtree
    mask >>= 1
    children = []
    while mask > 0:
        if vrank + mask < p:
            children.append(((vrank + mask + root) % p, buf))
        mask >>= 1
    if children:
        link.exchange(children, ())


def broadcast_chain(link: Link, buf: np.ndarray, root: int, segment_nbytes: int) -> None:
    """Pipelined chain root -> root+1 -> ... in segments of ``segment_nbytes``."""
    r, p = link.rank, link.size
    if p == 1:
        return
    vrank = (r - root) % p
    prev, nxt = (r - 1) % p, (r + 1) % p
    pieces = [buf[a:b] for a, b in segments(0, buf.nbytes, elements_per(segment_nbytes, 1))]
    if vrank == 0:
        for piece in pieces:
            link.send(nxt, piece)
        return
    if vrank == p - 1:
        for piece in pieces:
            link.recv(prev, piece)
        return
    # middle of the chain: forward piece k while piece k+1 arrives
    link.recv(prev, pieces[0])
    for k in range(1, len(pieces)):
        link.exchange([(nxt, pieces[k - 1])], [(prev, pieces[k])])
    link.send(nxt, pieces[-1])


__all__ = ["broadcast_chain", "broadcast_tree"]

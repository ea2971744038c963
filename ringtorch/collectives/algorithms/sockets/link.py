"""The point-to-point interface the socket algorithms are written against.

A socket algorithm (ring.py, tree.py, recursive_doubling.py, direct.py) sees a ``Link``: its
rank, the group size, blocking ``send``/``recv`` of a byte buffer to/from one peer, and
``exchange`` (several sends and receives at once, which never deadlocks on full buffers).
Frames are stamped and checked by the link, not the algorithm. The implementations:
``MeshLink`` (transports/sockets.py) puts the collective's header (built from its
CollectiveCall by call.py; layout in ``_wire/mesh.py``) in front of every payload over the
group's PeerMesh and checks the header of every frame it receives, so mismatched collectives
are detected wherever an algorithm receives; ``SubLink`` (hierarchical.py) runs an algorithm
among a subset of the ranks over another Link; ``SoloLink`` (transports/sockets.py) is a
group of one.

The shared-memory algorithms (``algorithms/shm/``) are not written against a Link: they work
in the slot space of the group's shared memory (shm/space.py), rounds rather than messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Link(Protocol):
    """A rank's connections to its group, as algorithms use them."""

    rank: int
    size: int

    def send(self, peer: int, data: np.ndarray) -> None:
        """Send ``data`` (uint8) to ``peer``; returns once it is handed to the transport."""

    def recv(self, peer: int, into: np.ndarray) -> None:
        """Receive the next frame from ``peer`` into ``into`` (uint8, exactly its size).

        Raises:
            FrameMismatch: the peer runs a different collective, size or dtype.
            PeerLost: the peer is gone or the group was aborted.
        """

    def exchange(self, sends: Sequence[tuple[int, np.ndarray]],
                 recvs: Sequence[tuple[int, np.ndarray]]) -> None:
        """Do all ``sends`` and ``recvs`` at once, in any order the transport likes."""

    def scratch(self, nbytes: int) -> np.ndarray:
        """A uint8 work buffer of ``nbytes`` owned by the link, reused across calls (its
        contents are undefined; at most one scratch buffer is live per collective)."""


__all__ = ["Link"]

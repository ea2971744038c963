"""The point-to-point interface the socket algorithms are written against, and its versions.

A socket algorithm (ring.py, tree.py, recursive_doubling.py, direct.py) sees a ``Link``: its
rank, the group size, blocking ``send``/``recv`` of a byte buffer to/from one peer, and
``exchange`` (several sends and receives at once, which never deadlocks on full buffers).
Frames are stamped and checked by the link, not the algorithm: ``MeshLink`` puts the
collective's header (built from its CollectiveCall by call.py; layout in ``_wire/mesh.py``)
in front of every payload and checks the header of every frame it receives, so mismatched
collectives are detected wherever an algorithm receives. ``SubLink`` (hierarchical.py) runs an
algorithm among a subset of the ranks; ``SoloLink`` is a group of one.

The shared-memory algorithms (``algorithms/shm/``) are not written against a Link: they work
in the slot space of the group's shared memory (shm/space.py), rounds rather than messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ringtorch._wire.mesh import PeerMesh


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


class MeshLink:
    """``Link`` over a PeerMesh for one collective call (cheap to build per call).

    ``prefix`` is the call's frame header without its payload size (call.frame_prefix)."""

    __slots__ = ("rank", "size", "_mesh", "_prefix", "_scratch")

    def __init__(self, mesh: PeerMesh, scratch: ScratchPool, prefix: bytes) -> None:
        self.rank = mesh.rank
        self.size = mesh.size
        self._mesh = mesh
        self._scratch = scratch
        self._prefix = prefix

    def _header(self, nbytes: int) -> bytes:
        return self._prefix + nbytes.to_bytes(8, "little")

    def send(self, peer: int, data: np.ndarray) -> None:
        """See base class."""
        self._mesh.exchange(((peer, self._header(data.nbytes), data),), ())

    def recv(self, peer: int, into: np.ndarray) -> None:
        """See base class."""
        self._mesh.recv(peer, self._header(into.nbytes), into)

    def exchange(self, sends: Sequence[tuple[int, np.ndarray]],
                 recvs: Sequence[tuple[int, np.ndarray]]) -> None:
        """See base class."""
        header = self._header
        self._mesh.exchange([(p, header(d.nbytes), d) for p, d in sends],
                            [(p, header(d.nbytes), d) for p, d in recvs])

    def scratch(self, nbytes: int) -> np.ndarray:
        """See base class."""
        return self._scratch.get(nbytes)


class SoloLink:
    """The Link of a group of one: nothing to exchange."""

    rank = 0
    size = 1

    def __init__(self, scratch: ScratchPool) -> None:
        self._scratch = scratch

    def send(self, peer: int, data: np.ndarray) -> None:
        """See base class."""
        raise AssertionError("a group of one has no peers")

    def recv(self, peer: int, into: np.ndarray) -> None:
        """See base class."""
        raise AssertionError("a group of one has no peers")

    def exchange(self, sends: Sequence[tuple[int, np.ndarray]],
                 recvs: Sequence[tuple[int, np.ndarray]]) -> None:
        """See base class."""
        assert not sends and not recvs

    def scratch(self, nbytes: int) -> np.ndarray:
        """See base class."""
        return self._scratch.get(nbytes)


class ScratchPool:
    """One growing work buffer per transport: algorithms never allocate per call or chunk."""

    def __init__(self) -> None:
        self._buf = np.empty(0, dtype=np.uint8)

    def get(self, nbytes: int) -> np.ndarray:
        if self._buf.nbytes < nbytes:
            self._buf = np.empty(nbytes, dtype=np.uint8)
        return self._buf[:nbytes]


__all__ = ["Link", "MeshLink", "ScratchPool", "SoloLink"]

"""The socket transport: every collective as one of the socket algorithms over the group's mesh.

The algorithm comes from algorithms/select.py's table (a callable, chosen per (op, size) and
cached); the link it runs over, a MeshLink (this module's implementation of the algorithms'
``Link``), stamps every frame with the call's header (call.frame_prefix) and checks every
frame it receives. Reductions arrive lowered (lowering.py): a base-op byte
reducer and, for all_reduce, a post step applied once to the whole result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ringtorch._wire.mesh import PeerMesh
from ringtorch.collectives.algorithms.select import ROOT_ONLY_REDUCTION, Choice, choose
from ringtorch.collectives.algorithms.sockets import direct, recursive_doubling
from ringtorch.collectives.algorithms.sockets.link import Link
from ringtorch.collectives.call import CollectiveCall, frame_prefix
from ringtorch.collectives.lowering import PostStep
from ringtorch.collectives.reduce_op import ByteReducer


class SocketTransport:
    """Collectives over a PeerMesh (None for a group of one).

    Attributes:
        rank, size: this rank and the group size.
        same_host: whether every rank shares this host (the algorithm table's segment size).
        description: what the group uses, in words.
    """

    uses_shm = False
    shares_memory = False

    def __init__(self, mesh: PeerMesh | None, rank: int, size: int,
                 overrides: dict[str, str]) -> None:
        self.mesh = mesh
        self.rank, self.size = rank, size
        self.same_host = mesh is None or all(mesh.same_host)
        self.description = "sockets"
        self._overrides = overrides
        self._scratch = ScratchPool()
        self._choices: dict[tuple[str, int], Choice] = {}

    # -- plumbing -------------------------------------------------------------------------------

    def link(self, call: CollectiveCall) -> Link:
        """The Link of one call: its frames carry the call's header."""
        if self.mesh is None:
            return SoloLink(self._scratch)
        return MeshLink(self.mesh, self._scratch, frame_prefix(call))

    def choose(self, op: str, nbytes: int) -> Choice:
        """The algorithm for ``op`` on ``nbytes`` in this group (cached)."""
        key = (op, nbytes)
        found = self._choices.get(key)
        if found is None:
            if len(self._choices) > 4096:
                self._choices.clear()
            found = self._choices[key] = choose(op, nbytes, self.size, self.same_host,
                                                self._overrides)
        return found

    def choose_among(self, op: str, nbytes: int, members: int) -> Choice:
        """The algorithm for ``op`` among ``members`` ranks on several hosts (hierarchy.py)."""
        return choose(op, nbytes, members, False, self._overrides)

    def socket_deadline(self, call: CollectiveCall) -> float:
        """When a socket wait of ``call`` gives up."""
        return call.deadline

    # -- collectives ----------------------------------------------------------------------------

    def all_reduce(self, call: CollectiveCall, data: np.ndarray, reducer: ByteReducer,
                   itemsize: int, post: PostStep | None) -> None:
        """Reduce ``data`` in place on every rank; ``post`` once on the result."""
        choice = self.choose("all_reduce", data.nbytes)
        choice.run(self.link(call), data, reducer, itemsize, choice.segment_nbytes)
        if post is not None:
            post(data)

    def broadcast(self, call: CollectiveCall, data: np.ndarray, itemsize: int) -> None:
        """Root's ``data`` into every rank's."""
        choice = self.choose("broadcast", data.nbytes)
        choice.run(self.link(call), data, call.root, choice.segment_nbytes)

    def reduce(self, call: CollectiveCall, data: np.ndarray, reducer: ByteReducer,
               itemsize: int) -> None:
        """The reduction into root's ``data``."""
        choice = self.choose("reduce", data.nbytes)
        if choice.run in ROOT_ONLY_REDUCTION:
            call = call.without_redop()
        choice.run(self.link(call), data, call.root, reducer, itemsize, choice.segment_nbytes)

    def all_gather(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray,
                   itemsize: int) -> None:
        """Every rank's ``inp`` into every rank's ``out``, in rank order."""
        self.choose("all_gather", out.nbytes).run(self.link(call), out, inp)

    def gather(self, call: CollectiveCall, out: np.ndarray | None, inp: np.ndarray,
               itemsize: int) -> None:
        """Every rank's ``inp`` into root's ``out``."""
        direct.gather(self.link(call), out, inp, call.root)

    def scatter(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray | None,
                itemsize: int) -> None:
        """Root's ``inp`` slice r into rank r's ``out``."""
        direct.scatter(self.link(call), out, inp, call.root)

    def reduce_scatter(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray,
                       reducer: ByteReducer, itemsize: int) -> None:
        """Slice r of the reduction of every rank's ``inp`` into rank r's ``out``."""
        choice = self.choose("reduce_scatter", inp.nbytes)
        choice.run(self.link(call), out, inp, reducer, itemsize, choice.segment_nbytes)

    def all_to_all(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray,
                   out_offsets: list[int], in_offsets: list[int]) -> None:
        """Block j of ``inp`` to rank j, block j of ``out`` from rank j (byte offsets)."""
        # every rank's sizes differ: the frames compare the call without its byte count
        direct.all_to_all(self.link(call._replace(nbytes=0)), out, inp, out_offsets,
                          in_offsets)

    def barrier(self, call: CollectiveCall) -> None:
        """Return once every rank has entered."""
        recursive_doubling.barrier(self.link(call))

    # -- lifetime -------------------------------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Nothing of its own to tell (the backend's ABORT frames and shutdown do it)."""

    def close(self) -> None:
        """Nothing of its own (the backend closes the mesh)."""

    def shared_buffer(self, call: CollectiveCall) -> Any:
        """No shared memory here: callers fall back to an ordinary tensor."""
        return None


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


__all__ = ["MeshLink", "ScratchPool", "SocketTransport", "SoloLink"]

"""Pure pieces of the hierarchical collectives (shared memory within a host, sockets across):
the group's topology and a ``Link`` over a subset of the group's ranks.

A ``Topology`` groups the ranks by host (hosts ordered by their lowest rank) and names one
*leader* per host, its lowest rank. The cross-host step of a collective runs one of the
socket algorithms (ring, tree, recursive doubling, direct) unchanged among one rank per host:
``SubLink`` renumbers the chosen ranks 0..k-1 for the algorithm and maps each peer back to its
group rank on the group's socket mesh, so frames keep the collective's stamped headers and
every check of the socket path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ringtorch.collectives.algorithms.sockets.link import Link


@dataclass(frozen=True)
class Topology:
    """Which ranks share a host.

    Attributes:
        hosts: group ranks per host, each ascending; hosts ordered by their lowest rank.
        host_of: host index of every group rank.
    """

    hosts: tuple[tuple[int, ...], ...]
    host_of: tuple[int, ...]

    @staticmethod
    def from_hosts(identities: Sequence[str]) -> Topology:
        """The topology of a group whose rank r runs on host ``identities[r]``."""
        first: dict[str, int] = {}
        for ident in identities:
            first.setdefault(ident, len(first))
        hosts: list[list[int]] = [[] for _ in first]
        for r, ident in enumerate(identities):
            hosts[first[ident]].append(r)
        return Topology(tuple(tuple(h) for h in hosts),
                        tuple(first[ident] for ident in identities))

    @property
    def leaders(self) -> tuple[int, ...]:
        """The lowest rank of every host, in host order."""
        return tuple(h[0] for h in self.hosts)

    @property
    def contiguous(self) -> bool:
        """Whether every host's ranks are consecutive and hosts follow each other in order."""
        return [r for h in self.hosts for r in h] == list(range(len(self.host_of)))

    def representatives(self, root: int) -> tuple[int, ...]:
        """One rank per host for a rooted collective: ``root`` on its host, leaders elsewhere."""
        home = self.host_of[root]
        return tuple(root if i == home else h[0] for i, h in enumerate(self.hosts))

    def describe(self) -> str:
        """E.g. "2 hosts: [0, 1] shm, [2] alone; leaders [0, 2] over sockets"."""
        parts = [f"{list(h)} {'shm' if len(h) > 1 else 'alone'}" for h in self.hosts]
        return (f"{len(self.hosts)} hosts: {', '.join(parts)}; leaders {list(self.leaders)} "
                f"over sockets")


class SubLink:
    """A ``Link`` among ``members`` (group ranks, one of them this rank's), renumbered
    0..len(members)-1 in the given order, over the group's full link."""

    __slots__ = ("rank", "size", "_link", "_members")

    def __init__(self, link: Link, members: Sequence[int], me: int) -> None:
        self._link = link
        self._members = list(members)
        self.rank = self._members.index(me)
        self.size = len(self._members)

    def send(self, peer: int, data: np.ndarray) -> None:
        """See base class."""
        self._link.send(self._members[peer], data)

    def recv(self, peer: int, into: np.ndarray) -> None:
        """See base class."""
        self._link.recv(self._members[peer], into)

    def exchange(self, sends: Sequence[tuple[int, np.ndarray]],
                 recvs: Sequence[tuple[int, np.ndarray]]) -> None:
        """See base class."""
        m = self._members
        self._link.exchange([(m[p], d) for p, d in sends], [(m[p], d) for p, d in recvs])

    def scratch(self, nbytes: int) -> np.ndarray:
        """See base class."""
        return self._link.scratch(nbytes)


__all__ = ["SubLink", "Topology"]

"""The hierarchical transport of a group spanning hosts: shared memory within each host,
sockets (TCP) between hosts. See docs/design/shared-memory.md, "Groups spanning hosts".

Chosen by transports/__init__.py when the flat shared-memory setup found the ranks on several
hosts: every rank reads every rank's record of that setup (host identity and whether shared
memory is on for it) from the group's store, so all ranks see the same topology. Then the
ranks of each host with two or more ranks open a shared-memory domain among themselves (store
prefix ``rt_shm/host<h>/``; its messages name group ranks), and every rank publishes its
verdict; the group goes hierarchical only if every verdict is "ok", else every rank stays on
the socket transport.

One rank per host (its *leader*, the lowest; the root's host uses the root) takes part in the
cross-host step: one of the socket algorithms, unchanged, among those ranks (a SubLink over
the composed SocketTransport's links, so frames keep the call's header and every check):

* all_reduce: shm reduce to the leader, all_reduce among leaders, shm broadcast. (Built but
  off, SLICED_FROM_NBYTES: shm reduce_scatter, every rank all_reduces its slice with its
  counterparts, shm all_gather; measured 2x slower from 1 MB on one 2-core machine.)
* broadcast: shm broadcast on the root's host, socket broadcast from the root to the other
  hosts' leaders, shm broadcast on those hosts.
* all_gather: shm all_gather, leaders exchange host blocks, shm broadcast of the result.
* reduce_scatter: shm reduce to the leader, leaders exchange and reduce per-host pieces,
  shm broadcast of the host's pieces (each rank keeps its own).
  Both only below SOCKETS_FROM_NBYTES (the whole buffer); larger ones take the sockets.
* barrier: shm barrier, barrier among leaders, shm barrier.
* reduce, gather, scatter, all_to_all: the sockets (reduce applies the root's reduction only,
  which a per-host pre-reduction could not honour); all but reduce are published in the host
  domain first, so a host peer waiting in shared memory sees where this rank is.

Failures: the host domain is wired to the group's AbortState as the flat one is. Waits that
can only end after the cross-host step (the leaders' socket waits, the local phases after it)
run CROSS_GRACE_S, resp. AFTER_GRACE_S, past the caller's deadline, so a late rank is reported
by the rank that waits for it directly, and its abort reaches the others first; the graces
are a few tenths of a second, so no rank raises later than that past its deadline.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ringtorch import _config
from ringtorch._wire.shm_setup import open_domain, read_keys
from ringtorch.collectives.abort import AbortState
from ringtorch.collectives.algorithms.shm import copy as shm_copy
from ringtorch.collectives.algorithms.shm import reduce as shm_reduce
from ringtorch.collectives.algorithms.shm.space import ShmSpace, reduce_in_rank_order
from ringtorch.collectives.algorithms.sockets import recursive_doubling
from ringtorch.collectives.algorithms.sockets.hierarchical import SubLink, Topology
from ringtorch.collectives.call import CollectiveCall
from ringtorch.collectives.lowering import PostStep
from ringtorch.collectives.reduce_op import ByteReducer
from ringtorch.collectives.reports import ShmWords
from ringtorch.collectives.transports.shm import attach
from ringtorch.collectives.transports.sockets import ScratchPool, SocketTransport

# how long past the caller's deadline the leaders' socket waits (CROSS_GRACE_S) and the host
# phases after the cross-host step (AFTER_GRACE_S) run: the rank that waits for a late rank
# directly must time out, name it and abort the group first. It raises at its deadline (a
# wait's last slice ends there and the late ranks were asked where they are ahead of it), and
# its abort reaches the others within milliseconds: the graces cover the ranks' deadlines
# differing by when each started the collective.
CROSS_GRACE_S = 0.2
# all_reduce from this size, when every host has as many ranks, runs sliced (every rank talks
# across) instead of through the leaders
SLICED_FROM_NBYTES = 1 << 62
# all_gather (whole output) and reduce_scatter (whole input) from this size take the socket
# path: there the leaders' serial work (one rank per host reduces or sends everything) made
# them slower than every rank working at once (docs/benchmarks/details.md, "Hierarchical collectives")
SOCKETS_FROM_NBYTES = 256 * 1024
AFTER_GRACE_S = CROSS_GRACE_S + 0.2
_SETUP = "setting up hierarchical shared memory"


def open_hierarchy(ctx: Any, sockets: SocketTransport, abort: AbortState,
                   on_failure: Callable[[str], None],
                   deadline: float) -> tuple[HierarchyTransport | None, str]:
    """Set up the hierarchy for a group whose flat setup just ran, or decide not to.

    Returns:
        (transport, "") or (None, why not; "" when the flat setup's reason stands).

    Raises:
        DistBackendError: a rank did not publish its records before ``deadline``.
    """
    import json

    records = [json.loads(v) for v in read_keys(
        ctx.store, [f"rt_shm/seg/{r}" for r in range(ctx.size)], deadline, _SETUP)]
    if any(rec["why"] for rec in records):
        return None, ""
    topo = Topology.from_hosts([rec["host"] for rec in records])
    if len(topo.hosts) < 2 or all(len(h) == 1 for h in topo.hosts):
        return None, ""
    host = topo.host_of[ctx.rank]
    local = topo.hosts[host]
    domain, why = None, ""
    if len(local) > 1:
        settings = {"chunk": _config.SHM_CHUNK_BYTES.get(),
                    "oneshot": _config.SHM_ONESHOT_BYTES.get()}
        domain, why = open_domain(ctx.store, local.index(ctx.rank), len(local), ctx.group_name,
                                  records[ctx.rank]["host"], True, _config.SHM_MAX_BYTES.get(),
                                  deadline, ShmWords(ctx.group_name), settings,
                                  prefix=f"rt_shm/host{host}", names=local)
        why = f"rank {ctx.rank}: {why}" if why else ""
    try:
        ctx.store.set(f"rt_shm/hier/{ctx.rank}", why or "ok")
        verdicts = [v.decode() for v in read_keys(
            ctx.store, [f"rt_shm/hier/{r}" for r in range(ctx.size)], deadline, _SETUP)]
    except BaseException:
        if domain is not None:
            domain.close()
        raise
    bad = next((v for v in verdicts if v != "ok"), "")
    if bad:
        if domain is not None:
            domain.close()
        return None, f"the group spans {len(topo.hosts)} hosts and {bad}"
    space = None if domain is None else attach(domain, abort, on_failure)
    return HierarchyTransport(sockets, topo, space), ""


class HierarchyTransport:
    """The hierarchical collectives of one group (see the module docstring).

    Attributes:
        topology: the group's Topology.
        space: this host's slot space (None when this rank is alone on its host).
        sockets: the socket transport (the cross-host steps, and the ops that stay on it).
        description: e.g. "2 hosts: [0, 1] shm, [2, 3] shm; leaders [0, 2] over sockets".
    """

    uses_shm = True
    shares_memory = False

    def __init__(self, sockets: SocketTransport, topology: Topology,
                 space: ShmSpace | None) -> None:
        self.sockets = sockets
        self.topology = topology
        self.space = space
        self.rank, self.size = sockets.rank, sockets.size
        self._host = topology.host_of[self.rank]
        self._local = topology.hosts[self._host]
        self._leaders = topology.leaders
        self._leader = self.rank == self._local[0]
        self._sliced = len({len(h) for h in topology.hosts}) == 1 and len(self._local) > 1
        self._work = ScratchPool()
        self.description = topology.describe()

    def _cross(self, call: CollectiveCall, members: tuple[int, ...]) -> SubLink:
        return SubLink(self.sockets.link(call), members, self.rank)

    def _on_sockets(self, call: CollectiveCall) -> bool:
        """Whether ``call`` runs on the sockets alone (published in the host domain)."""
        if call.op == "all_gather":
            return call.nbytes * self.size >= SOCKETS_FROM_NBYTES
        if call.op == "reduce_scatter":
            return call.nbytes >= SOCKETS_FROM_NBYTES
        return call.op in ("reduce", "gather", "scatter", "all_to_all")

    def _publish(self, call: CollectiveCall) -> None:
        if self.space is not None:
            self.space.domain.enter(call.without_redop())

    def socket_deadline(self, call: CollectiveCall) -> float:
        """The caller's deadline, plus CROSS_GRACE_S for the hierarchical steps."""
        return call.deadline if self._on_sockets(call) else call.deadline + CROSS_GRACE_S

    # -- collectives ---------------------------------------------------------------------------

    def all_reduce(self, call: CollectiveCall, data: np.ndarray, reducer: ByteReducer,
                   itemsize: int, post: PostStep | None) -> None:
        """Reduce to each host's leader, all_reduce among leaders, broadcast on each host;
        or, from SLICED_FROM_NBYTES when every host has as many ranks, reduce_scatter on
        each host, all_reduce of each slice among the ranks holding it, all_gather."""
        space, deadline = self.space, call.deadline
        if space is not None and self._sliced and data.nbytes >= SLICED_FROM_NBYTES:
            self._all_reduce_sliced(space, call, data, reducer, itemsize)
        else:
            if space is not None:
                shm_reduce.reduce(space, data, reducer, 0, itemsize, call, deadline)
            if self._leader:
                self._cross_all_reduce(self._cross(call, self._leaders), data, reducer,
                                       itemsize)
            if space is not None:
                shm_copy.broadcast(space, data, 0, itemsize, call, deadline + AFTER_GRACE_S)
        if post is not None:
            post(data)

    def _cross_all_reduce(self, link: SubLink, data: np.ndarray, reducer: ByteReducer,
                          itemsize: int) -> None:
        choice = self.sockets.choose_among("all_reduce", data.nbytes, link.size)
        choice.run(link, data, reducer, itemsize, choice.segment_nbytes)

    def _all_reduce_sliced(self, space: ShmSpace, call: CollectiveCall, data: np.ndarray,
                           reducer: ByteReducer, itemsize: int) -> None:
        """Every host has L ranks: local rank i ends the reduce_scatter with slice i reduced
        over its host, all_reduces it with local rank i of every other host, and the host
        all_gathers the slices (padded to L equal slices of whole elements)."""
        n_local, i = len(self._local), self._local.index(self.rank)
        m = -(-data.nbytes // itemsize // n_local) * itemsize
        work = self._work.get((n_local + 1) * m)
        padded, mine = (data, work[:m]) if m * n_local == data.nbytes else \
            (work[:n_local * m], work[n_local * m:])
        if padded is not data:
            np.copyto(padded[:data.nbytes], data)
            padded[data.nbytes:] = 0
        shm_reduce.reduce_scatter(space, mine, padded, reducer, itemsize, call, call.deadline)
        members = tuple(h[i] for h in self.topology.hosts)
        self._cross_all_reduce(self._cross(call, members), mine, reducer, itemsize)
        shm_copy.all_gather(space, padded, mine, itemsize, call, call.deadline + AFTER_GRACE_S)
        if padded is not data:
            np.copyto(data, padded[:data.nbytes])

    def broadcast(self, call: CollectiveCall, data: np.ndarray, itemsize: int) -> None:
        """Within the root's host, then from the root to the other hosts' leaders over
        sockets, then within each of those hosts."""
        space, root, deadline = self.space, call.root, call.deadline
        reps = self.topology.representatives(root)
        home = self._host == self.topology.host_of[root]
        src = self._local.index(reps[self._host])
        if space is not None and home:
            shm_copy.broadcast(space, data, src, itemsize, call, deadline)
        if self.rank in reps:
            link = self._cross(call, reps)
            choice = self.sockets.choose_among("broadcast", data.nbytes, link.size)
            choice.run(link, data, reps.index(root), choice.segment_nbytes)
        if space is not None and not home:
            shm_copy.broadcast(space, data, src, itemsize, call, deadline + AFTER_GRACE_S)

    def all_gather(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray,
                   itemsize: int) -> None:
        """Gather within each host, leaders exchange host blocks, broadcast within each host."""
        if self._on_sockets(call):
            self._publish(call)
            self.sockets.all_gather(call, out, inp, itemsize)
            return
        space, topo, deadline = self.space, self.topology, call.deadline
        m = inp.nbytes
        # stage: every host's block, hosts in order (out itself when that is rank order)
        stage = out if topo.contiguous else self._work.get(self.size * m)
        starts = _starts(topo)
        blocks = [stage[starts[g] * m:(starts[g] + len(h)) * m]
                  for g, h in enumerate(topo.hosts)]
        mine = blocks[self._host]
        if space is not None:
            shm_copy.all_gather(space, mine, inp, itemsize, call, deadline)
        else:
            np.copyto(mine, inp)
        if self._leader:
            link = self._cross(call, self._leaders)
            others = [g for g in range(len(topo.hosts)) if g != self._host]
            link.exchange([(g, mine) for g in others], [(g, blocks[g]) for g in others])
            if stage is not out:
                for g, ranks in enumerate(topo.hosts):
                    for i, r in enumerate(ranks):
                        np.copyto(out[r * m:(r + 1) * m],
                                  stage[(starts[g] + i) * m:(starts[g] + i + 1) * m])
        if space is not None:
            shm_copy.broadcast(space, out, 0, itemsize, call, deadline + AFTER_GRACE_S)

    def reduce_scatter(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray,
                       reducer: ByteReducer, itemsize: int) -> None:
        """Reduce within each host to its leader, leaders reduce each host's pieces, each
        host's pieces broadcast within it."""
        if self._on_sockets(call):
            self._publish(call)
            self.sockets.reduce_scatter(call, out, inp, reducer, itemsize)
            return
        space, deadline = self.space, call.deadline
        m, n_local = out.nbytes, len(self._local)
        # scratch: the leader's copy of the input (reduced in place), the pieces in host
        # order (when hosts' ranks are not consecutive), the other hosts' partials of this
        # host's pieces, this host's reduced pieces
        leader, hosts = self._leader, len(self.topology.hosts)
        lens = [self.size * m if leader and space is not None else 0,
                self.size * m if leader and not self.topology.contiguous else 0,
                (hosts - 1) * n_local * m if leader else 0, n_local * m]
        work = self._work.get(sum(lens))
        acc_w, pack_w, slots, mine = (work[sum(lens[:i]):sum(lens[:i + 1])] for i in range(4))
        if leader:
            acc = inp
            if space is not None:  # the leader reduces into a copy: inp stays as given
                acc = acc_w
                np.copyto(acc, inp)
                shm_reduce.reduce(space, acc, reducer, 0, itemsize, call, deadline)
            self._cross_reduce_scatter(call, acc, pack_w, slots, mine, reducer)
        elif space is not None:
            shm_reduce.reduce(space, inp, reducer, 0, itemsize, call, deadline)
        if space is not None:
            shm_copy.broadcast(space, mine, 0, itemsize, call, deadline + AFTER_GRACE_S)
        i = self._local.index(self.rank)
        np.copyto(out, mine[i * m:(i + 1) * m])

    def _cross_reduce_scatter(self, call: CollectiveCall, acc: np.ndarray, packed: np.ndarray,
                              slots: np.ndarray, mine: np.ndarray, reducer: ByteReducer) -> None:
        """Leaders: ``acc`` holds this host's partial of every rank's piece (rank order);
        afterwards ``mine`` holds the full reduction of this host's ranks' pieces. ``packed``
        (``acc``'s size, or empty when the hosts' ranks are consecutive) and ``slots`` (the
        other hosts' partials of this host's pieces) are scratch."""
        topo = self.topology
        m = mine.nbytes // len(self._local)
        starts = _starts(topo)
        if topo.contiguous:
            packed = acc
        else:  # pieces in host order, so that each host's pieces are one block
            for g, ranks in enumerate(topo.hosts):
                for i, r in enumerate(ranks):
                    np.copyto(packed[(starts[g] + i) * m:(starts[g] + i + 1) * m],
                              acc[r * m:(r + 1) * m])
        blocks = [packed[starts[g] * m:(starts[g] + len(h)) * m] for g, h in enumerate(topo.hosts)]
        others = [g for g in range(len(topo.hosts)) if g != self._host]
        theirs = {g: slots[k * mine.nbytes:(k + 1) * mine.nbytes] for k, g in enumerate(others)}
        link = self._cross(call, self._leaders)
        link.exchange([(g, blocks[g]) for g in others], [(g, theirs[g]) for g in others])
        operands = [blocks[g] if g == self._host else theirs[g] for g in range(len(topo.hosts))]
        reduce_in_rank_order(mine, operands, -1, reducer)

    def barrier(self, call: CollectiveCall) -> None:
        """Everyone on each host arrives, the leaders meet, everyone on each host leaves."""
        space = self.space
        if space is not None:
            space.domain.arrive(call, call.deadline)
        if self._leader:
            recursive_doubling.barrier(self._cross(call, self._leaders))
        if space is not None:
            space.domain.arrive(call, call.deadline + AFTER_GRACE_S)

    # -- collectives on the sockets ---------------------------------------------------------------

    def reduce(self, call: CollectiveCall, data: np.ndarray, reducer: ByteReducer,
               itemsize: int) -> None:
        """On the sockets (the root's reduction only)."""
        self.sockets.reduce(call, data, reducer, itemsize)

    def gather(self, call: CollectiveCall, out: np.ndarray | None, inp: np.ndarray,
               itemsize: int) -> None:
        """On the sockets."""
        self._publish(call)
        self.sockets.gather(call, out, inp, itemsize)

    def scatter(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray | None,
                itemsize: int) -> None:
        """On the sockets."""
        self._publish(call)
        self.sockets.scatter(call, out, inp, itemsize)

    def all_to_all(self, call: CollectiveCall, out: np.ndarray, inp: np.ndarray,
                   out_offsets: list[int], in_offsets: list[int]) -> None:
        """On the sockets."""
        self._publish(call)
        self.sockets.all_to_all(call, out, inp, out_offsets, in_offsets)

    # -- lifetime --------------------------------------------------------------------------------

    def shared_buffer(self, call: CollectiveCall) -> Any:
        """No shared buffers across hosts: callers fall back to an ordinary tensor."""
        return None

    def abort(self, reason: str) -> None:
        """Tell this host's peers through the segment."""
        if self.space is not None:
            self.space.domain.abort(reason)

    def close(self) -> None:
        """Unmap this host's segments."""
        space, self.space = self.space, None
        if space is not None:
            space.close()
            space.domain.close()


def _starts(topo: Topology) -> list[int]:
    """Index of each host's first rank in host order."""
    starts, n = [], 0
    for h in topo.hosts:
        starts.append(n)
        n += len(h)
    return starts


__all__ = ["AFTER_GRACE_S", "CROSS_GRACE_S", "SLICED_FROM_NBYTES", "SOCKETS_FROM_NBYTES",
           "HierarchyTransport", "open_hierarchy"]

"""Hierarchical collectives for a group spanning hosts: shared memory within each host,
sockets (TCP) between hosts. See docs/design/shared-memory.md, "Groups spanning hosts".

Set up by ``ShmNativeBackend`` when its flat shared-memory setup found the ranks on several
hosts: every rank reads every rank's record of that setup (host identity and whether shared
memory is on for it) from the group's store, so all ranks see the same topology. Then the
ranks of each host with two or more ranks open a shared-memory domain among themselves (store
prefix ``rt_shm/host<h>/``), and every rank publishes its verdict; the group goes
hierarchical only if every verdict is "ok", else every rank stays on the socket path.

One rank per host (its *leader*, the lowest; the root's host uses the root) takes part in the
cross-host step: one of the socket algorithms, unchanged, among those ranks
(algorithms/hierarchical.py's SubLink) over the group's existing socket mesh:

* all_reduce: shm reduce to the leader, all_reduce among leaders, shm broadcast. (Built but
  off, SLICED_FROM_NBYTES: shm reduce_scatter, every rank all_reduces its slice with its
  counterparts, shm all_gather; measured 2x slower from 1 MB on one 2-core machine.)
* broadcast: shm broadcast on the root's host, socket broadcast from the root to the other
  hosts' leaders, shm broadcast on those hosts.
* all_gather: shm all_gather, leaders exchange host blocks, shm broadcast of the result.
* reduce_scatter: shm reduce to the leader, leaders exchange and reduce per-host pieces,
  shm broadcast of the host's pieces (each rank keeps its own).
  Both only below SOCKETS_FROM_NBYTES (the whole buffer); larger ones take the socket path.
* barrier: shm barrier, barrier among leaders, shm barrier.
* reduce, gather, scatter, all_to_all, send/recv: the socket path (reduce applies the
  root's reduction only, which a per-host pre-reduction could not honour).

The hierarchy installs its collectives on the backend *instance* (``install``), so
ShmNativeBackend's flat path stays as it is and costs nothing extra.

Failures: the host domain names ranks by their group ranks (``HostDomain``), polls the
backend's abort cause, and aborts the group on its own failures, as the flat path does. Waits
that can only end after the cross-host step (the leaders' socket waits, the local phases after
it) run CROSS_GRACE_S, resp. AFTER_GRACE_S, past the caller's deadline, so a late rank is
reported by the rank that waits for it directly, and its abort reaches the others first.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from ringtorch import _config
from ringtorch._wire.mesh import NO_REDOP, NO_ROOT
from ringtorch._wire.shm_domain import Desc, ShmDomain
from ringtorch._wire.shm_setup import open_domain, read_keys
from ringtorch.collectives.algorithms import direct, recursive_doubling, ring, shm_copy, shm_reduce, tree
from ringtorch.collectives.algorithms.hierarchical import SubLink, Topology
from ringtorch.collectives.algorithms.link import ScratchPool
from ringtorch.collectives.algorithms.select import choose
from ringtorch.collectives.algorithms.shm_space import ShmSpace, reduce_in_rank_order
from ringtorch.collectives.backends.native import NativeBackend
from ringtorch.collectives.backends.native_status import check_sizes
from ringtorch.collectives.backends.shm_native import (
    ShmNativeBackend,
    _bytes,
    describe,
    make_desc,
)
from ringtorch.collectives.reduce_op import RedOpType, finish_avg, premul_factor

# how long past the caller's deadline the leaders' socket waits (CROSS_GRACE_S) and the host
# phases after the cross-host step (AFTER_GRACE_S) run: the rank that waits for a late rank
# directly must time out, name it and abort the group first; a socket wait checks its
# deadline once a second and then asks the peers where they are (up to 1 s)
CROSS_GRACE_S = 0.5
# all_reduce from this size, when every host has as many ranks, runs sliced (every rank talks
# across) instead of through the leaders
SLICED_FROM_NBYTES = 1 << 62
# all_gather (whole output) and reduce_scatter (whole input) from this size take the socket
# path: there the leaders' serial work (one rank per host reduces or sends everything) made
# them slower than every rank working at once (BENCHMARKS.md, "Hierarchical collectives")
SOCKETS_FROM_NBYTES = 256 * 1024
AFTER_GRACE_S = CROSS_GRACE_S + 3.0

INSTALLED = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "_publish",
             "abort", "close")


class HostDomain(ShmDomain):
    """A ShmDomain among one host's ranks whose messages name group ranks (``names[i]`` is
    local rank i's group rank), not the domain's local indices."""

    names: list[int]

    def _name(self, j: int) -> int:
        return self.names[j]


def open_hierarchy(b: ShmNativeBackend, deadline: float) -> tuple[Hierarchy | None, str]:
    """Set up the hierarchy for ``b`` (whose flat setup just ran), or decide not to.

    Returns:
        (hierarchy, "") or (None, why not; "" when the flat setup's reason stands).

    Raises:
        DistBackendError: a rank did not publish its records before ``deadline``.
    """
    ctx = b.ctx
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
                                  deadline, describe, settings, prefix=f"rt_shm/host{host}")
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
    space = None
    if domain is not None:
        domain.__class__ = HostDomain  # same state, messages in group ranks
        domain.names = list(local)  # type: ignore[attr-defined]
        domain.poll_failure = lambda: b._cause
        domain.on_failure = lambda message: b._abort_local(message, tell_peers=True)
        space = ShmSpace(domain, domain.settings["chunk"], domain.settings["oneshot"])
    return Hierarchy(b, topo, space), ""


_SETUP = "setting up hierarchical shared memory"


class Hierarchy:
    """The hierarchical collectives of one backend (see the module docstring).

    Attributes:
        topology: the group's Topology.
        description: e.g. "2 hosts: [0, 1] shm, [2, 3] shm; leaders [0, 2] over sockets".
    """

    def __init__(self, backend: ShmNativeBackend, topology: Topology,
                 space: ShmSpace | None) -> None:
        self._b = backend
        self.topology = topology
        self._space = space
        self._host = topology.host_of[backend.rank]
        self._local = topology.hosts[self._host]
        self._leaders = topology.leaders
        self._leader = backend.rank == self._local[0]
        self._sliced = len({len(h) for h in topology.hosts}) == 1 and len(self._local) > 1
        self._work = ScratchPool()
        self.description = topology.describe()

    def install(self) -> None:
        """Route the backend's collectives, abort and close through this hierarchy."""
        for name in INSTALLED:
            setattr(self._b, name, getattr(self, name.lstrip("_")))

    # -- helpers -------------------------------------------------------------------------------

    def _cross(self, op: str, dtype: torch.dtype, redop: int, root: int, seq: int, nbytes: int,
               members: tuple[int, ...]) -> SubLink:
        return SubLink(self._b._link(op, dtype, redop, root, seq, nbytes), members, self._b.rank)

    def _choose(self, op: str, nbytes: int, members: int) -> tuple[str, int]:
        choice = choose(op, nbytes, members, False, self._b._overrides)
        return choice.algorithm, choice.segment_nbytes

    # -- collectives ---------------------------------------------------------------------------

    def all_reduce(self, buf: torch.Tensor, op: Any, seq: int, deadline: float) -> None:
        """Reduce to each host's leader, all_reduce among leaders, broadcast on each host;
        or, from SLICED_FROM_NBYTES when every host has as many ranks, reduce_scatter on
        each host, all_reduce of each slice among the ranks holding it, all_gather."""
        b, space = self._b, self._space
        kind, reducer = b._plan_reduce(op, buf.dtype, "all_reduce")
        with b._collective("all_reduce", seq, deadline + CROSS_GRACE_S):
            factor = premul_factor(op) if kind is RedOpType.PREMUL_SUM else None
            if factor is not None:
                buf.mul_(factor)
            data, itemsize = _bytes(buf), buf.element_size()
            desc = b._desc("all_reduce", seq, buf.dtype, int(kind), -1, data.nbytes)
            if space is not None and self._sliced and data.nbytes >= SLICED_FROM_NBYTES:
                self._all_reduce_sliced(space, data, reducer, itemsize, desc, deadline,
                                        buf.dtype, int(kind), seq)
            else:
                if space is not None:
                    shm_reduce.reduce(space, data, reducer, 0, itemsize, desc, deadline)
                if self._leader:
                    self._cross_all_reduce(self._cross(
                        "all_reduce", buf.dtype, int(kind), NO_ROOT, seq, data.nbytes,
                        self._leaders), data, reducer, itemsize)
                if space is not None:
                    shm_copy.broadcast(space, data, 0, itemsize, desc, deadline + AFTER_GRACE_S)
            if kind is RedOpType.AVG:
                finish_avg(buf, b.size)

    def _cross_all_reduce(self, link: SubLink, data: np.ndarray, reducer: Any,
                          itemsize: int) -> None:
        algorithm, segment = self._choose("all_reduce", data.nbytes, link.size)
        if algorithm == "ring":
            ring.all_reduce(link, data, reducer, itemsize, segment)
        elif algorithm == "scatter_gather":
            direct.all_reduce_scatter_gather(link, data, reducer, itemsize, segment)
        elif algorithm == "recursive_doubling":
            recursive_doubling.all_reduce(link, data, reducer)
        else:
            direct.all_reduce(link, data, reducer)

    def _all_reduce_sliced(self, space: ShmSpace, data: np.ndarray, reducer: Any, itemsize: int,
                           desc: Desc, deadline: float, dtype: torch.dtype, redop: int,
                           seq: int) -> None:
        """Every host has L ranks: local rank i ends the reduce_scatter with slice i reduced
        over its host, all_reduces it with local rank i of every other host, and the host
        all_gathers the slices (padded to L equal slices of whole elements)."""
        n_local, i = len(self._local), self._local.index(self._b.rank)
        m = -(-data.nbytes // itemsize // n_local) * itemsize
        work = self._work.get((n_local + 1) * m)
        padded, mine = (data, work[:m]) if m * n_local == data.nbytes else \
            (work[:n_local * m], work[n_local * m:])
        if padded is not data:
            np.copyto(padded[:data.nbytes], data)
            padded[data.nbytes:] = 0
        shm_reduce.reduce_scatter(space, mine, padded, reducer, itemsize, desc, deadline)
        members = tuple(h[i] for h in self.topology.hosts)
        self._cross_all_reduce(self._cross("all_reduce", dtype, redop, NO_ROOT, seq, data.nbytes,
                                           members), mine, reducer, itemsize)
        shm_copy.all_gather(space, padded, mine, itemsize, desc, deadline + AFTER_GRACE_S)
        if padded is not data:
            np.copyto(data, padded[:data.nbytes])

    def broadcast(self, buf: torch.Tensor, root: int, seq: int, deadline: float) -> None:
        """Within the root's host, then from the root to the other hosts' leaders over
        sockets, then within each of those hosts."""
        b, space = self._b, self._space
        b._check_root(root, "broadcast")
        with b._collective("broadcast", seq, deadline + CROSS_GRACE_S):
            data = _bytes(buf)
            reps = self.topology.representatives(root)
            home = self._host == self.topology.host_of[root]
            desc = b._desc("broadcast", seq, buf.dtype, NO_REDOP, root, data.nbytes)
            src = self._local.index(reps[self._host])
            if space is not None and home:
                shm_copy.broadcast(space, data, src, buf.element_size(), desc, deadline)
            if b.rank in reps:
                link = self._cross("broadcast", buf.dtype, NO_REDOP, root, seq, data.nbytes, reps)
                algorithm, segment = self._choose("broadcast", data.nbytes, link.size)
                if algorithm == "chain":
                    tree.broadcast_chain(link, data, reps.index(root), segment)
                else:
                    tree.broadcast_tree(link, data, reps.index(root))
            if space is not None and not home:
                shm_copy.broadcast(space, data, src, buf.element_size(), desc,
                                   deadline + AFTER_GRACE_S)

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor, seq: int, deadline: float) -> None:
        """Gather within each host, leaders exchange host blocks, broadcast within each host."""
        b, space, topo = self._b, self._space, self.topology
        check_sizes("all_gather", out, inp, b.size)
        if out.numel() * out.element_size() >= SOCKETS_FROM_NBYTES:
            self.publish("all_gather", seq, inp, -1)
            return NativeBackend.all_gather(b, out, inp, seq, deadline)
        with b._collective("all_gather", seq, deadline + CROSS_GRACE_S):
            inp_b, out_b, itemsize = _bytes(inp), _bytes(out), inp.element_size()
            m = inp_b.nbytes
            desc = b._desc("all_gather", seq, inp.dtype, NO_REDOP, -1, m)
            # stage: every host's block, hosts in order (out itself when that is rank order)
            stage = out_b if topo.contiguous else self._work.get(b.size * m)
            starts = _starts(topo)
            blocks = [stage[starts[g] * m:(starts[g] + len(h)) * m]
                      for g, h in enumerate(topo.hosts)]
            mine = blocks[self._host]
            if space is not None:
                shm_copy.all_gather(space, mine, inp_b, itemsize, desc, deadline)
            else:
                np.copyto(mine, inp_b)
            if self._leader:
                link = self._cross("all_gather", inp.dtype, NO_REDOP, NO_ROOT, seq, m,
                                   self._leaders)
                others = [g for g in range(len(topo.hosts)) if g != self._host]
                link.exchange([(g, mine) for g in others], [(g, blocks[g]) for g in others])
                if stage is not out_b:
                    for g, ranks in enumerate(topo.hosts):
                        for i, r in enumerate(ranks):
                            np.copyto(out_b[r * m:(r + 1) * m],
                                      stage[(starts[g] + i) * m:(starts[g] + i + 1) * m])
            if space is not None:
                shm_copy.broadcast(space, out_b, 0, itemsize, desc, deadline + AFTER_GRACE_S)

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, op: Any, seq: int,
                       deadline: float) -> None:
        """Reduce within each host to its leader, leaders reduce each host's pieces, each
        host's pieces broadcast within it."""
        b, space = self._b, self._space
        kind, reducer = b._plan_reduce(op, inp.dtype, "reduce_scatter")
        check_sizes("reduce_scatter", inp, out, b.size)
        if inp.numel() * inp.element_size() >= SOCKETS_FROM_NBYTES:
            self.publish("reduce_scatter", seq, inp, -1)
            return NativeBackend.reduce_scatter(b, out, inp, op, seq, deadline)
        with b._collective("reduce_scatter", seq, deadline + CROSS_GRACE_S):
            factor = premul_factor(op) if kind is RedOpType.PREMUL_SUM else None
            if factor is not None:
                inp = inp * factor
            inp_b, out_b, itemsize = _bytes(inp), _bytes(out), inp.element_size()
            m, n_local = out_b.nbytes, len(self._local)
            desc = b._desc("reduce_scatter", seq, inp.dtype, int(kind), -1, inp_b.nbytes)
            # scratch: the leader's copy of the input (reduced in place), the pieces in host
            # order (when hosts' ranks are not consecutive), the other hosts' partials of this
            # host's pieces, this host's reduced pieces
            leader, hosts = self._leader, len(self.topology.hosts)
            lens = [b.size * m if leader and space is not None else 0,
                    b.size * m if leader and not self.topology.contiguous else 0,
                    (hosts - 1) * n_local * m if leader else 0, n_local * m]
            work = self._work.get(sum(lens))
            acc_w, pack_w, slots, mine = (work[sum(lens[:i]):sum(lens[:i + 1])]
                                          for i in range(4))
            if leader:
                acc = inp_b
                if space is not None:  # the leader reduces into a copy: inp stays as given
                    acc = acc_w
                    np.copyto(acc, inp_b)
                    shm_reduce.reduce(space, acc, reducer, 0, itemsize, desc, deadline)
                self._cross_reduce_scatter(acc, pack_w, slots, mine, reducer, inp.dtype,
                                           int(kind), seq, inp_b.nbytes)
            elif space is not None:
                shm_reduce.reduce(space, inp_b, reducer, 0, itemsize, desc, deadline)
            if space is not None:
                shm_copy.broadcast(space, mine, 0, itemsize, desc, deadline + AFTER_GRACE_S)
            i = self._local.index(b.rank)
            np.copyto(out_b, mine[i * m:(i + 1) * m])
            if kind is RedOpType.AVG:
                finish_avg(out, b.size)

    def _cross_reduce_scatter(self, acc: np.ndarray, packed: np.ndarray, slots: np.ndarray,
                              mine: np.ndarray, reducer: Any, dtype: torch.dtype, redop: int,
                              seq: int, nbytes: int) -> None:
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
        link = self._cross("reduce_scatter", dtype, redop, NO_ROOT, seq, nbytes, self._leaders)
        link.exchange([(g, blocks[g]) for g in others], [(g, theirs[g]) for g in others])
        operands = [blocks[g] if g == self._host else theirs[g] for g in range(len(topo.hosts))]
        reduce_in_rank_order(mine, operands, -1, reducer)

    def barrier(self, seq: int, deadline: float) -> None:
        """Everyone on each host arrives, the leaders meet, everyone on each host leaves."""
        b, space = self._b, self._space
        with b._collective("barrier", seq, deadline + CROSS_GRACE_S):
            desc = b._desc("barrier", seq, torch.uint8, NO_REDOP, -1, 0)
            if space is not None:
                space.domain.arrive(desc, deadline)
            if self._leader:
                recursive_doubling.barrier(self._cross("barrier", torch.uint8, NO_REDOP, NO_ROOT,
                                                       seq, 0, self._leaders))
            if space is not None:
                space.domain.arrive(desc, deadline + AFTER_GRACE_S)

    # -- socket collectives, abort, close --------------------------------------------------------

    def publish(self, op: str, seq: int, tensor: torch.Tensor, root: int) -> None:
        """Publish a socket collective in the host domain (a host peer waiting in shared
        memory sees the mismatch at once)."""
        if self._space is not None:
            nbytes = tensor.numel() * tensor.element_size()
            self._space.domain.enter(make_desc(op, seq, tensor.dtype, NO_REDOP, root, nbytes))

    def abort(self, reason: str) -> None:
        """See Backend.abort."""
        if self._space is not None:
            self._space.domain.abort(f"rank {self._b.rank} aborted the group: {reason}")
        NativeBackend.abort(self._b, reason)

    def close(self) -> None:
        """See Backend.close."""
        ShmNativeBackend.close(self._b)
        space, self._space = self._space, None
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
           "HostDomain", "Hierarchy", "open_hierarchy"]

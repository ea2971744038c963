"""The dynamic rendezvous (``--rdzv-backend c10d``): nodes agree on their ranks through a store.

No node is told its rank. The launcher whose host owns ``--rdzv-endpoint`` hosts a TCPStore
there (the others connect to it; every connection proves the job secret), and the nodes meet
in numbered rounds. All keys live under ``ringrun/{run_id}/`` and hold JSON or decimal text,
never pickles:

    latest              the newest frozen round (where a newcomer starts)
    closed              why a node gave up on the job; everyone stops
    closed_seen         counter of nodes that read ``closed`` (its writer waits for them)
    r{R}/joined         counter: each node's ``add(1)`` is its arrival number in round R
    r{R}/members        counter: nodes of round R-1 that joined round R (after ``joined``)
    r{R}/frozen         the number of nodes N of round R, set once by compare_set
    r{R}/node{i}        node i's {"nproc", "addr", "host"}
    r{R}/master         node 0's {"addr", "port"} for the workers' own store
    r{R}/restart        set by a member that leaves round R for a new one: "restart N" when
                        node N restarts its workers (the others follow, and count it),
                        "rejoin N" when the membership changes (the others follow, free)
    r{R}/left           counter: members of round R that left the job gracefully
    r{R}/done           counter of nodes whose workers succeeded (the exit barrier)

A round freezes as soon as ``--nnodes`` MAX nodes have joined, or ``last_call_timeout``
seconds after MIN have (``--rdzv-conf last_call_timeout=S``, default 30), at the count of that
moment; nodes that arrive after it are late and wait in round R+1, which makes the healthy
nodes of round R restart to admit them while the job has room for more nodes. Round R+1
freezes only once every node of round R that has not left has joined it too (or
``heartbeat_timeout`` seconds, default 30, after the first of them did: the others are taken
as dead), so that a newcomer waits for the running nodes instead of starting a job of its
own. Node ranks are arrival numbers; global ranks follow node ranks (node i's workers come
after node i-1's).

A node whose launcher is signalled leaves the job gracefully when the others keep at least
``--nnodes`` MIN nodes without it and it does not host the store: it counts itself in
``r{R}/left`` before stopping its workers, and the others restart theirs in a new round
without it, free of charge (torch's agent keeps the rendezvous open too, for scaling events).
Otherwise it closes the job, as a node that gives up does.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ringtorch._errors import DistError
from ringtorch._wire.errors import HandshakeError
from ringtorch._wire.sockets import free_port
from ringtorch.launcher.config import LaunchConfig, parse_endpoint
from ringtorch.launcher.node_rendezvous import (
    NodeRendezvous,
    RendezvousClosedError,
    RendezvousError,
)
from ringtorch.launcher.workers import Assignment
from ringtorch.store import TCPStore

_POLL_S = 0.05
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


def is_local_host(host: str) -> bool:
    """True when ``host`` names this machine (so this node may host the store there)."""
    if host in _LOOPBACK or host.startswith("127."):
        return True
    try:
        wanted = {info[4][0] for info in socket.getaddrinfo(host, None)}
        mine = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except socket.gaierror:
        return False
    return bool(wanted & (mine | {"127.0.0.1", "::1"}))


def address_towards(host: str) -> str:
    """The local address this machine uses to reach ``host`` (what other nodes can use to
    reach us): the source address of a UDP route lookup, which sends no packet."""
    if host in _LOOPBACK or host.startswith("127."):
        return "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, 9))
            return str(probe.getsockname()[0])
        except OSError:
            return socket.getfqdn()


class C10dRendezvous(NodeRendezvous):
    """See the module docstring."""

    def __init__(self, config: LaunchConfig) -> None:
        self.config = config
        self.host, self.port = parse_endpoint(config.rdzv_endpoint)
        conf = config.rdzv_configs
        self.join_timeout = float(conf.get("join_timeout", 600))
        self.last_call_timeout = float(conf.get("last_call_timeout", 30))
        self.close_timeout = float(conf.get("close_timeout", 300))
        self.heartbeat_timeout = float(conf.get("heartbeat_timeout", 30))
        self._is_host_conf = conf.get("is_host")
        self.prefix = f"ringrun/{config.run_id}/"
        self.store: Any = None
        self.is_host = False
        self.round = 0
        self.node_rank = -1
        self.nnodes = 0
        self._closed: str | None = None

    # -- store plumbing --------------------------------------------------------------------

    def _key(self, name: str, round_: int | None = None) -> str:
        return self.prefix + (f"r{round_}/{name}" if round_ is not None else name)

    def _connect(self) -> None:
        timeout = timedelta(seconds=self.join_timeout)
        wants_host = (self._is_host_conf in ("1", "true", "True") if self._is_host_conf
                      else is_local_host(self.host))
        if wants_host:
            try:
                self.store = TCPStore(self.host, self.port, is_master=True, timeout=timeout,
                                      wait_for_workers=False)
                self.is_host = True
                return
            except OSError:
                pass  # another launcher on this machine hosts it: be its client
        try:
            self.store = TCPStore(self.host, self.port, is_master=False, timeout=timeout)
        except HandshakeError as exc:
            raise RendezvousError(f"the rendezvous store at {self.host}:{self.port} and this "
                                  f"node do not share the job secret: {exc}") from None
        except (DistError, OSError) as exc:
            raise RendezvousError(
                f"cannot reach the rendezvous endpoint {self.host}:{self.port} within "
                f"{self.join_timeout:g} s: {exc}") from None

    def _peek(self, name: str, round_: int | None = None) -> bytes | None:
        key = self._key(name, round_)
        return self.store.get(key) if self.store.check([key]) else None

    def _count(self, name: str, round_: int) -> int:
        return int(self.store.add(self._key(name, round_), 0))

    # -- the round -------------------------------------------------------------------------

    def next_round(self, stop: Callable[[], bool]) -> Assignment:
        """See base class."""
        deadline = time.monotonic() + self.join_timeout
        try:
            if self.store is None:
                self._connect()
            member_of = self.round  # the round this node leaves (0: none)
            if member_of:  # make the other members follow
                kind = "rejoin" if self.num_nodes_waiting() or self.peer_left() else "restart"
                self.store.set(self._key("restart", member_of), f"{kind} {self.node_rank}")
            round_ = member_of + 1 if member_of else int(self._peek("latest") or b"1")
            while True:
                self._raise_if_closed()
                arrival = int(self.store.add(self._key("joined", round_), 1))
                if member_of and round_ == member_of + 1:
                    self.store.add(self._key("members", round_), 1)  # after joined: see below
                nnodes = self._wait_frozen(round_, arrival, deadline, stop)
                if arrival <= nnodes:
                    break
                round_ += 1  # late for this round: wait in the next one
            self.round, self.node_rank, self.nnodes = round_, arrival - 1, nnodes
            return self._assign(deadline, stop)
        except (DistError, OSError) as exc:
            if isinstance(exc, RendezvousError):
                raise
            raise RendezvousError(f"rendezvous through {self.host}:{self.port} failed: "
                                  f"{exc}") from None

    def _wait_frozen(self, round_: int, arrival: int, deadline: float,
                     stop: Callable[[], bool]) -> int:
        low, high = self.config.min_nodes, self.config.max_nodes
        expected = self._expected_members(round_)
        if arrival == high and not expected:
            self._freeze(round_, high)
        enough_since: float | None = None
        members_since: float | None = None
        while True:
            frozen = self._peek("frozen", round_)
            if frozen is not None:
                return int(frozen)
            # members before joined: a member adds to joined first, so every member counted
            # here is in the count read next
            members = self._count("members", round_) if expected else 0
            count = self._count("joined", round_)
            now = time.monotonic()
            if members:
                members_since = members_since or now
            members_in = members >= expected or (
                members_since is not None and now - members_since >= self.heartbeat_timeout)
            if count >= low and members_in:
                enough_since = enough_since or now
                if count >= high or now - enough_since >= self.last_call_timeout:
                    self._freeze(round_, min(count, high))
                    continue
            self._raise_if_closed()
            if stop():
                raise RendezvousError("rendezvous interrupted")
            if now >= deadline:
                raise RendezvousError(
                    f"timed out after {self.join_timeout:g} s waiting for nodes to join round "
                    f"{round_} at {self.host}:{self.port}: {count} joined, --nnodes needs at "
                    f"least {low}")
            time.sleep(_POLL_S)

    def _expected_members(self, round_: int) -> int:
        """How many nodes of round ``round_ - 1`` are still in the job (they will join
        ``round_`` when they notice it); 0 when that round never formed."""
        frozen = self._peek("frozen", round_ - 1) if round_ > 1 else None
        if frozen is None:
            return 0
        return max(int(frozen) - self._count("left", round_ - 1), 0)

    def _freeze(self, round_: int, nnodes: int) -> None:
        self.store.compare_set(self._key("frozen", round_), "", str(nnodes))
        self.store.set(self._key("latest"), str(round_))

    def _wait_value(self, name: str, deadline: float, stop: Callable[[], bool]) -> bytes:
        while True:
            value = self._peek(name, self.round)
            if value is not None:
                return value
            self._raise_if_closed()
            if stop() or time.monotonic() >= deadline:
                raise RendezvousError(f"round {self.round}: gave up waiting for {name} "
                                      f"(a node left during the rendezvous?)")
            time.sleep(_POLL_S)

    def _assign(self, deadline: float, stop: Callable[[], bool]) -> Assignment:
        addr = self.config.local_addr or address_towards(self.host)
        me = {"nproc": self.config.nproc_per_node, "addr": addr, "host": socket.gethostname()}
        self.store.set(self._key(f"node{self.node_rank}", self.round), json.dumps(me))
        nodes = [json.loads(self._wait_value(f"node{i}", deadline, stop))
                 for i in range(self.nnodes)]
        if self.node_rank == 0:
            port = free_port("127.0.0.1" if addr.startswith("127.") else "")
            self.store.set(self._key("master", self.round), json.dumps({"addr": addr,
                                                                       "port": port}))
        master = json.loads(self._wait_value("master", deadline, stop))
        sizes = [int(node["nproc"]) for node in nodes]
        return Assignment(round=self.round, group_rank=self.node_rank,
                          group_world_size=self.nnodes,
                          base_global_rank=sum(sizes[:self.node_rank]), world_size=sum(sizes),
                          master_addr=str(master["addr"]), master_port=int(master["port"]))

    # -- watching the job ------------------------------------------------------------------

    def _raise_if_closed(self) -> None:
        reason = self.closed_reason()
        if reason is not None:
            raise RendezvousClosedError(f"the job was closed: {reason}")

    def num_nodes_waiting(self) -> int:
        """See base class: newcomers, counted only while the job has room for more nodes."""
        if self.store is None or not self.round or self._closed:
            return 0
        if self.nnodes >= self.config.max_nodes:
            return 0
        try:
            return self._count("joined", self.round + 1)
        except (DistError, OSError):
            return 0  # closed_reason() reports the lost store

    def restart_requested(self) -> bool:
        """See base class."""
        if self.store is None or not self.round or self._closed:
            return False
        try:
            value = self._peek("restart", self.round)
        except (DistError, OSError):
            return False
        return value is not None and not value.startswith(b"rejoin")

    def peer_left(self) -> bool:
        """See base class."""
        if self.store is None or not self.round or self._closed:
            return False
        try:
            return self._count("left", self.round) > 0
        except (DistError, OSError):
            return False

    def leave(self) -> bool:
        """See base class: not the store's host (the store would go with it), and only while
        the others keep ``--nnodes`` MIN nodes."""
        if self.store is None or not self.round or self._closed is not None or self.is_host:
            return False
        try:
            left = int(self.store.add(self._key("left", self.round), 1))
            if self.nnodes - left >= self.config.min_nodes:
                return True
            self.store.add(self._key("left", self.round), -1)  # not ours to leave: undo
        except (DistError, OSError):
            pass
        return False

    def closed_reason(self) -> str | None:
        """See base class."""
        if self._closed is None and self.store is not None:
            try:
                reason = self._peek("closed")
                if reason is not None:
                    self._closed = reason.decode(errors="replace")
                    self.store.add(self._key("closed_seen"), 1)
            except (DistError, OSError) as exc:
                self._closed = (f"lost the rendezvous store at {self.host}:{self.port} (its "
                                f"host node exited?): {exc}")
        return self._closed

    def close(self, reason: str) -> None:
        """See base class. The store's host waits (a few seconds at most) until the other
        nodes have read the reason, so that they report it rather than a lost store."""
        if self.store is None or self._closed is not None:
            return
        try:
            self.store.compare_set(self._key("closed"), "", reason)
            deadline = time.monotonic() + min(5.0, self.close_timeout)
            while (self.is_host and self.nnodes > 1 and time.monotonic() < deadline
                   and int(self.store.add(self._key("closed_seen"), 0)) < self.nnodes - 1):
                time.sleep(_POLL_S)
        except (DistError, OSError):
            pass

    def finish(self, stop: Callable[[], bool]) -> None:
        """See base class: the host keeps the store up until every node is done."""
        try:
            self.store.add(self._key("done", self.round), 1)
            deadline = time.monotonic() + self.close_timeout
            while self.is_host and (self._count("done", self.round)
                                    < self.nnodes - self._count("left", self.round)):
                if self.closed_reason() or stop() or time.monotonic() >= deadline:
                    return
                time.sleep(_POLL_S)
        except (DistError, OSError):
            pass

    def shutdown(self) -> None:
        """See base class."""
        store, self.store = self.store, None
        close = getattr(store, "close", None)
        if close is not None:
            try:
                close()
            except (DistError, OSError):
                pass


__all__ = ["C10dRendezvous", "address_towards", "is_local_host"]

"""The owner's side of RRefs and the fork protocol's bookkeeping, one per agent.

``RRefContext`` keeps the values this worker owns (``_OwnerEntry``: the value's future and
the forks that reference it), the "child" holds a user keeps while a fork it passed on is not
yet recorded by the owner, and the user references deleted since the last flush to their
owners. See rref.py for the protocol and docs/design/rref-protocol.md for its guarantees.
``statistics()`` is a snapshot of all of it, for diagnostics and for tests that wait on the
protocol's progress (a delete that reached its owner) instead of sleeping.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ringtorch.distributed.rpc import messages
from ringtorch.distributed.rpc._interfaces import Agent
from ringtorch.distributed.rpc._workerinfo import WorkerInfo, describe
from ringtorch.futures import Future

Id = tuple[int, int]  # (worker that made it, counter on that worker)


class UserReference(Protocol):
    """What the context calls on a user RRef (rref.RRef) at shutdown."""

    def _release(self) -> None:
        """Queue the delete of this reference for its owner (once)."""


@dataclass(frozen=True)
class RRefStatistics:
    """A snapshot of one worker's RRef bookkeeping (``RRefContext.statistics()``)."""

    owned_values: int       # values owned here that some reference still needs
    user_forks: int         # user references elsewhere that those values have recorded
    child_holds: int        # references this worker passed on, held until the owner knows
    user_references: int    # live user references on this worker
    deletes_queued: int     # deleted user references not yet reported to their owners
    deletes_sent: int       # deleted user references reported to their owners, ever
    deletes_received: int   # user forks dropped on their holders' delete messages, ever
    forks_recorded: int     # forks of this worker's user references the owner confirmed, ever


class _OwnerEntry:
    """The owner's record of one value: its future and the forks that reference it."""

    __slots__ = ("__weakref__", "future", "rref_id", "users")

    def __init__(self, rref_id: Id) -> None:
        self.rref_id = rref_id
        self.future: Future[Any] = Future()
        self.users: dict[Id, int] = {}  # fork id -> rank holding it


class RRefContext:
    """One worker's RRef bookkeeping: owned values, child holds, pending deletes."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.lock = threading.Lock()
        self.owners: dict[Id, _OwnerEntry] = {}
        self.children: dict[Id, tuple[object, int]] = {}  # fork id -> (held RRef, child rank)
        self.users: weakref.WeakSet[UserReference] = weakref.WeakSet()
        self.deletes: collections.deque[tuple[int, Id, Id]] = collections.deque()
        self.closed = False
        self._counter = itertools.count()
        # every value this worker made, while some object here still refers to it
        self._alive: weakref.WeakValueDictionary[Id, _OwnerEntry] = weakref.WeakValueDictionary()
        self._deletes_sent = 0
        self._deletes_received = 0
        self._forks_recorded = 0
        agent.on_peer_death(self._peer_died)
        agent.every_tick(self.flush_deletes)

    def close(self) -> None:
        """RPC is shutting down: user references deleted from now on are not reported, and
        none may be sent any more."""
        self.closed = True

    def statistics(self) -> RRefStatistics:
        """A consistent snapshot of this context (see ``RRefStatistics``)."""
        with self.lock:
            return RRefStatistics(
                owned_values=len(self.owners),
                user_forks=sum(len(entry.users) for entry in self.owners.values()),
                child_holds=len(self.children), user_references=len(self.users),
                deletes_queued=len(self.deletes), deletes_sent=self._deletes_sent,
                deletes_received=self._deletes_received, forks_recorded=self._forks_recorded)

    def new_id(self) -> Id:
        return (self.agent.info.id, next(self._counter))

    def new_entry(self) -> _OwnerEntry:
        """The entry of a value made here (``RRef(value)``, ``remote()`` to itself)."""
        entry = _OwnerEntry(self.new_id())
        with self.lock:
            self._alive[entry.rref_id] = entry
        return entry

    def entry(self, rref_id: Id) -> _OwnerEntry:
        """The owner entry of ``rref_id``, created pending if another worker made the id.

        A value made here whose forks are all gone is still found while a local RRef holds
        it: a user's delete (sent at shutdown on its own connection) may overtake the reply
        that passes its reference back to us.

        Raises:
            RuntimeError: this worker made the id and no longer has it.
        """
        with self.lock:
            found = self.owners.get(rref_id)
            if found is None:
                if rref_id[0] == self.agent.info.id:
                    found = self._alive.get(rref_id)
                    if found is not None:
                        return found
                    raise RuntimeError(f"RRef {_gid(rref_id)} no longer exists on its owner "
                                       f"{self.agent.info}: every reference to it was deleted")
                found = self.owners[rref_id] = _OwnerEntry(rref_id)
            return found

    def add_user(self, entry: _OwnerEntry, fork_id: Id, holder: int) -> None:
        with self.lock:
            self.owners[entry.rref_id] = entry
            entry.users[fork_id] = holder

    def drop_users(self, forks: list[tuple[Id, Id]], deleted: bool = False) -> None:
        """Forget user forks (``deleted``: their holders deleted them); an entry left without
        users is dropped (G1)."""
        with self.lock:
            if deleted:
                self._deletes_received += len(forks)
            for rref_id, fork_id in forks:
                entry = self.owners.get(rref_id)
                if entry is not None:
                    entry.users.pop(fork_id, None)
                    if not entry.users:
                        del self.owners[rref_id]

    def flush_deletes(self, now: float | None = None) -> None:
        """Tell owners about deleted user references (batched; periodic)."""
        batches: dict[int, list[tuple[Id, Id]]] = {}
        while self.deletes:
            owner, rref_id, fork_id = self.deletes.popleft()
            batches.setdefault(owner, []).append((rref_id, fork_id))
        for owner, forks in batches.items():
            if self.agent.is_dead(owner):
                continue
            self.agent.request(self.agent.worker(owner), messages.RREF_USER_DELETE, forks, 0,
                               "RRef delete", one_way=True)
            with self.lock:
                self._deletes_sent += len(forks)

    def request_fork(self, rref_id: Id, fork_id: Id, owner: WorkerInfo, parent: int,
                     confirm: Callable[[], None]) -> None:
        """Ask ``owner`` to record the fork ``fork_id`` this worker received from ``parent``;
        once it has, ``confirm()`` and tell the parent it may let go of its hold."""
        agent = self.agent

        def recorded(value: Any, error: BaseException | None) -> None:
            if error is None:
                confirm()
                with self.lock:
                    self._forks_recorded += 1
            if parent == agent.info.id:
                self.child_accepted(fork_id)
            elif not agent.is_dead(parent):
                agent.request(agent.worker(parent), messages.RREF_CHILD_ACCEPT, fork_id, 0,
                              "RRef child accept", one_way=True)

        agent.request(owner, messages.RREF_FORK_REQUEST, (rref_id, fork_id),
                      agent.rpc_timeout, f"RRef fork of {_gid(rref_id)} to {describe(agent.info)}",
                      on_done=recorded)

    def child_accepted(self, fork_id: Id) -> None:
        with self.lock:
            self.children.pop(fork_id, None)

    def _peer_died(self, rank: int, error: BaseException) -> None:
        with self.lock:
            for rref_id, entry in list(self.owners.items()):
                for fork_id in [f for f, holder in entry.users.items() if holder == rank]:
                    del entry.users[fork_id]
                if not entry.users:
                    del self.owners[rref_id]
            for fork_id in [f for f, (_, holder) in self.children.items() if holder == rank]:
                del self.children[fork_id]

    def add_user_reference(self, rref: UserReference) -> None:
        """Track a user reference (deleted by ``delete_all_users`` at shutdown)."""
        with self.lock:
            self.users.add(rref)

    def hold_child(self, fork_id: Id, rref: object, child: int) -> None:
        """Keep ``rref`` alive until the owner has recorded ``fork_id`` (G3)."""
        with self.lock:
            self.children[fork_id] = (rref, child)

    def delete_all_users(self) -> None:
        """Shutdown: delete every live user reference and tell the owners now."""
        with self.lock:
            users = list(self.users)
        for rref in users:
            rref._release()
        self.flush_deletes()


def _gid(rref_id: Id) -> str:
    return f"GloballyUniqueId(created_on={rref_id[0]}, local_id={rref_id[1]})"



"""The owner's side of RRefs and the fork protocol's bookkeeping, one per agent.

``RRefContext`` keeps the values this worker owns (``_OwnerEntry``: the value's future and
the forks that reference it), the "child" holds a user keeps while a fork it passed on is not
yet recorded by the owner, and the user references deleted since the last flush to their
owners. See rref.py for the protocol and docs/design/rref-protocol.md for its guarantees.
"""

from __future__ import annotations

import collections
import itertools
import threading
import weakref
from typing import TYPE_CHECKING, Any

from ringtorch.distributed.rpc import messages
from ringtorch.distributed.rpc._workerinfo import describe
from ringtorch.distributed.rpc.agent import RpcAgent
from ringtorch.distributed.rpc.options import UNSET_RPC_TIMEOUT
from ringtorch.futures import Future

if TYPE_CHECKING:
    from ringtorch.distributed.rpc.rref import RRef

Id = tuple[int, int]  # (worker that made it, counter on that worker)


class _OwnerEntry:
    """The owner's record of one value: its future and the forks that reference it."""

    __slots__ = ("__weakref__", "future", "rref_id", "users")

    def __init__(self, rref_id: Id) -> None:
        self.rref_id = rref_id
        self.future: Future[Any] = Future()
        self.users: dict[Id, int] = {}  # fork id -> rank holding it


def resolve_timeout(agent: RpcAgent, timeout: float) -> float:
    """Seconds to wait (0: no limit) for a user-facing ``timeout`` argument."""
    return agent.rpc_timeout if timeout == UNSET_RPC_TIMEOUT else float(timeout)


class RRefContext:
    """One worker's RRef bookkeeping: owned values, child holds, pending deletes."""

    def __init__(self, agent: RpcAgent) -> None:
        self.agent = agent
        self.lock = threading.Lock()
        self.owners: dict[Id, _OwnerEntry] = {}
        self.children: dict[Id, tuple[RRef[Any], int]] = {}
        self.users: weakref.WeakSet[RRef[Any]] = weakref.WeakSet()
        self.deletes: collections.deque[tuple[int, Id, Id]] = collections.deque()
        self.closed = False
        self._counter = itertools.count()
        agent.peer_death_listeners.append(self._peer_died)
        agent.periodic_tasks.append(self.flush_deletes)

    def new_id(self) -> Id:
        return (self.agent.info.id, next(self._counter))

    def entry(self, rref_id: Id) -> _OwnerEntry:
        """The owner entry of ``rref_id``, created pending if another worker made the id.

        Raises:
            RuntimeError: this worker made the id and no longer has it.
        """
        with self.lock:
            found = self.owners.get(rref_id)
            if found is None:
                if rref_id[0] == self.agent.info.id:
                    raise RuntimeError(f"RRef {_gid(rref_id)} no longer exists on its owner "
                                       f"{self.agent.info}: every reference to it was deleted")
                found = self.owners[rref_id] = _OwnerEntry(rref_id)
            return found

    def add_user(self, entry: _OwnerEntry, fork_id: Id, holder: int) -> None:
        with self.lock:
            self.owners[entry.rref_id] = entry
            entry.users[fork_id] = holder

    def drop_users(self, forks: list[tuple[Id, Id]]) -> None:
        """Forget user forks; an entry left without users is dropped (G1)."""
        with self.lock:
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
            if owner in self.agent.dead:
                continue
            self.agent.request(self.agent.workers[owner], messages.RREF_USER_DELETE, forks, 0,
                               "RRef delete", one_way=True)

    def request_fork(self, user: RRef[Any], parent: int) -> None:
        """Ask the owner to record ``user``'s fork; then tell the parent it may let go."""
        agent = self.agent
        rref_id, fork_id = user._rref_id, user._fork_id

        def recorded(value: Any, error: BaseException | None) -> None:
            if error is None:
                user._confirmed = True
            if parent == agent.info.id:
                self.child_accepted(fork_id)
            elif parent not in agent.dead:
                agent.request(agent.workers[parent], messages.RREF_CHILD_ACCEPT, fork_id, 0,
                              "RRef child accept", one_way=True)

        agent.request(user._owner, messages.RREF_FORK_REQUEST, (rref_id, fork_id),
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

    def delete_all_users(self) -> None:
        """Shutdown: delete every live user reference and tell the owners now."""
        with self.lock:
            users = list(self.users)
        for rref in users:
            rref._release()
        self.flush_deletes()


def _gid(rref_id: Id) -> str:
    return f"GloballyUniqueId(created_on={rref_id[0]}, local_id={rref_id[1]})"



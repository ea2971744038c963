"""The owner's RRef bookkeeping without processes: forks recorded and dropped, the entry of a
value made here, and what ``statistics()`` reports. The agent is a stand-in that records
what the context registers on it (the context only calls ``_interfaces.Agent``)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest

from ringtorch.distributed.rpc._rref_context import RRefContext, RRefStatistics
from ringtorch.distributed.rpc._workerinfo import WorkerInfo


class StandInAgent:
    """Worker 0 of two; records the listeners and periodic tasks the context registers."""

    info = WorkerInfo("worker0", 0)
    world_size = 2
    rpc_timeout = 20.0
    closing = False

    def __init__(self) -> None:
        self.listeners: list[Callable[[int, BaseException], None]] = []
        self.tasks: list[Callable[[float], None]] = []
        self.sent: list[tuple[int, Any]] = []

    def worker(self, rank: int) -> WorkerInfo:
        return WorkerInfo(f"worker{rank}", rank)

    def is_dead(self, rank: int) -> bool:
        return False

    def on_peer_death(self, listener: Callable[[int, BaseException], None]) -> None:
        self.listeners.append(listener)

    def every_tick(self, task: Callable[[float], None]) -> None:
        self.tasks.append(task)

    def request(self, dst: WorkerInfo, kind: int, payload: Any, *args: Any, **kwargs: Any) -> None:
        self.sent.append((kind, payload))


def test_the_context_registers_its_peer_death_listener_and_its_delete_flush() -> None:
    agent = StandInAgent()
    ctx = RRefContext(agent)  # type: ignore[arg-type]
    assert len(agent.listeners) == 1 and agent.tasks == [ctx.flush_deletes]


def test_statistics_count_forks_and_deletes() -> None:
    ctx = RRefContext(StandInAgent())  # type: ignore[arg-type]
    entry = ctx.new_entry()
    ctx.add_user(entry, (1, 7), 1)
    ctx.add_user(entry, (1, 8), 1)
    ctx.drop_users([(entry.rref_id, (1, 7))], deleted=True)
    assert ctx.statistics() == RRefStatistics(
        owned_values=1, user_forks=1, child_holds=0, user_references=0, deletes_queued=0,
        deletes_sent=0, deletes_received=1, forks_recorded=0)


def test_deletes_are_sent_to_their_owners_in_one_batch_and_counted() -> None:
    agent = StandInAgent()
    ctx = RRefContext(agent)  # type: ignore[arg-type]
    ctx.deletes.extend([(1, (1, 0), (0, 1)), (1, (1, 0), (0, 2))])
    assert ctx.statistics().deletes_queued == 2
    ctx.flush_deletes()
    assert agent.sent == [(6, [((1, 0), (0, 1)), ((1, 0), (0, 2))])]  # one RREF_USER_DELETE
    assert (ctx.statistics().deletes_queued, ctx.statistics().deletes_sent) == (0, 2)


def test_a_value_made_here_is_found_while_a_local_reference_holds_it() -> None:
    ctx = RRefContext(StandInAgent())  # type: ignore[arg-type]
    entry = ctx.new_entry()
    rref_id = entry.rref_id
    ctx.add_user(entry, (1, 0), 1)
    ctx.drop_users([(rref_id, (1, 0))], deleted=True)  # the last fork is gone (G1) ...
    assert ctx.statistics().owned_values == 0
    assert ctx.entry(rref_id) is entry  # ... but a local RRef still holds the value
    del entry
    gc.collect()
    with pytest.raises(RuntimeError, match=r"^RRef GloballyUniqueId\(created_on=0, local_id=0\) "
                                           r"no longer exists on its owner WorkerInfo\(id=0, "
                                           r"name=worker0\): every reference to it was deleted$"):
        ctx.entry(rref_id)


def test_an_id_made_elsewhere_gets_a_pending_entry() -> None:
    ctx = RRefContext(StandInAgent())  # type: ignore[arg-type]
    entry = ctx.entry((1, 5))
    assert entry.rref_id == (1, 5) and not entry.future.done()
    assert ctx.entry((1, 5)) is entry

"""What starting a job costs each rank in store round trips: the same at any world size.

Each rank publishes its records once and reads everything it needs in one batched request,
for the default group, for every new group and for RPC's worker table, so that a job of
hundreds of ranks does not queue thousands of requests at the store. Counted with
``TCPStore.statistics()`` (requests this client sent) on every rank.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest

from ringtorch.distributed.rpc import _mesh as rpc_mesh
from ringtorch.store import PrefixStore, Store, TCPStore
from ringtorch.testing import run_ranks
from tests.integration import _rendezvous_cost_ranks as ranks

WORLDS = (2, 8, 32)


def test_statistics_counts_the_requests_a_client_sent_by_operation():
    master = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    client = TCPStore("127.0.0.1", master.port, None, False, timedelta(seconds=30))
    try:
        joined = client.statistics()
        assert joined.requests_by_op == {"add": 1} and joined.requests == 1  # joining the store
        client.set("a", b"1")
        client.set("b", b"2" * 70000)  # the large-value path counts too
        client.get("a")
        client.multi_get(["a", "b"])
        client.add("n", 3)
        twin = client.clone()
        twin.get("a")  # a clone counts its own requests
        stats = client.statistics()
        assert stats.requests_by_op == {"add": 2, "set": 2, "get": 1, "multi_get": 1}
        assert stats.requests == 6
        assert twin.statistics().requests_by_op == {"get": 1}
        assert master.statistics().requests_by_op == {"add": 1}  # the master's own join
        twin.close()
    finally:
        client.close()
        master.close()


def _most(results: list[dict[str, dict[str, int]]], phase: str) -> int:
    return max(sum(r[phase].values()) for r in results)


def test_a_rank_sends_as_many_store_requests_to_start_a_job_of_32_as_of_2():
    # one run per world: init_process_group + barrier, then new_group + barrier, every rank
    # counting what it sent (world 32 once: about 10 s of the suite on 2 cores)
    results = {w: run_ranks(ranks.group_requests, w, timeout=240) for w in WORLDS}
    init = {w: _most(r, "init") for w, r in results.items()}
    group = {w: _most(r, "new_group") for w, r in results.items()}
    assert len(set(init.values())) == 1, f"requests of init_process_group by world: {init}"
    assert len(set(group.values())) == 1, f"requests of new_group by world: {group}"
    assert 0 < init[2] <= 20 and 0 < group[2] <= 15, (init, group)


def _exchange(world: int) -> list[int]:
    """RPC's address exchange among ``world`` workers (threads, each with its own client):
    the requests each sent, and each worker's table checked against what every worker
    published."""
    master = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    clients = [TCPStore("127.0.0.1", master.port, None, False, timedelta(seconds=30))
               for _ in range(world)]
    before = [c.statistics().requests for c in clients]
    tables: list[list[dict]] = [[] for _ in range(world)]

    def worker(rank: int) -> None:
        tables[rank] = rpc_mesh.exchange_addresses(
            clients[rank], rank, world, f"worker{rank}", {"host": "h", "port": 1000 + rank})

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    expected = [{"name": f"worker{r}", "rank": r, "host": "h", "port": 1000 + r}
                for r in range(world)]
    assert all(json.dumps(t) == json.dumps(expected) for t in tables)
    sent = [c.statistics().requests - b for c, b in zip(clients, before, strict=True)]
    for store in (*clients, master):
        store.close()
    return sent


def test_an_rpc_worker_reads_the_whole_worker_table_in_one_request():
    sent = {w: _exchange(w) for w in WORLDS}
    assert {w: max(s) for w, s in sent.items()} == {w: 2 for w in WORLDS}, sent


class _GetOnlyStore(Store):
    """A user's store written with set and a blocking get only (no multi_get), behind a
    PrefixStore as a group or RPC sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.data[key] = value.encode() if isinstance(value, str) else bytes(value)
            self.cond.notify_all()

    def get(self, key):
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.data, timeout=30)
            return self.data[key]


def test_a_store_without_multi_get_is_read_one_key_at_a_time():
    store = PrefixStore("rpc", _GetOnlyStore())
    with pytest.raises(NotImplementedError, match="does not implement multi_get"):
        store.multi_get(["x"])  # so the batched read falls back to gets
    tables: dict[int, list] = {}

    def worker(rank: int) -> None:
        tables[rank] = rpc_mesh.exchange_addresses(store, rank, 2, f"w{rank}", {"port": rank})

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    expected = [{"name": "w0", "rank": 0, "port": 0}, {"name": "w1", "rank": 1, "port": 1}]
    assert tables == {0: expected, 1: expected}

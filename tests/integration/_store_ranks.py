"""Rank functions for the store and rendezvous integration tests (run by run_ranks).

Each runs in its own process. The TCPStore master lives in rank 0, so every function ends with
``_leave``: rank 0 waits until every other rank is done with the store before it returns (and
its server goes away with it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ringtorch.store import FileStore, Store, TCPStore
from ringtorch.testing import wait_for

TIMEOUT = timedelta(seconds=30)


def _tcp(rank: int, world_size: int) -> TCPStore:
    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                    rank == 0, TIMEOUT)


def _leave(store: Store, rank: int, world_size: int) -> None:
    store.set(f"left/{rank}", b"1")
    if rank == 0:
        store.wait([f"left/{r}" for r in range(world_size)])


def add_many(rank: int, world_size: int, times: int, kind: str, path: str = "") -> int:
    """Every rank adds 1 to one key ``times`` times; returns the total once all are done."""
    store = _tcp(rank, world_size) if kind == "tcp" else FileStore(path, world_size)
    for _ in range(times):
        store.add("total", 1)
    if store.add("done", 1) == world_size:
        store.set("all_done", b"1")
    store.wait(["all_done"])
    total = int(store.get("total"))
    _leave(store, rank, world_size)
    store.close()
    return total


def race_compare_set(rank: int, world_size: int, kind: str, path: str = "") -> bytes:
    """Every rank tries to claim "leader" at once; returns what compare_set returned."""
    store = _tcp(rank, world_size) if kind == "tcp" else FileStore(path, world_size)
    store.add("ready", 1)
    if rank == 0:
        _wait_count_then_set(store, "ready", world_size)
    store.wait(["ready_all"])
    result = store.compare_set("leader", "", f"rank{rank}")
    _leave(store, rank, world_size)
    store.close()
    return result


def _wait_count_then_set(store: Store, key: str, count: int) -> None:
    wait_for(lambda: int(store.add(key, 0)) >= count, TIMEOUT.total_seconds(),
             f"{count} ranks to count themselves in {key!r}")
    store.set(key + "_all", b"1")


def get_before_set(rank: int, world_size: int, kind: str, path: str = "") -> bytes:
    """Ranks > 0 block in get, then in wait, on keys that rank 0 sets only once they wait."""
    store = _tcp(rank, world_size) if kind == "tcp" else FileStore(path, world_size)
    if rank == 0:
        if kind == "tcp":  # the server runs here: wait until the others' gets are parked in it
            waiters = store._server._waiters
            wait_for(lambda: len(waiters.get(b"first", ())) == world_size - 1,
                     what="the other ranks' gets to wait in the server")
        else:
            _wait_parked(path, world_size, "get")
        store.set("first", b"from rank 0")
        if kind == "file":
            _wait_parked(path, world_size, "wait")
        store.set("second", b"2")
        value = b""
    else:
        parked = _mark_parked(store, path, rank) if kind == "file" else _Parked()
        parked.phase = "get"
        value = store.get("first")
        parked.phase = "wait"
        store.wait(["first", "second"])
    _leave(store, rank, world_size)
    store.close()
    return value


class _Parked:
    """Which call a FileStore reader is in, for the marker its poll leaves."""

    phase = ""


def _mark_parked(store: FileStore, path: str, rank: int) -> _Parked:
    """Make each poll of ``store`` that finds its keys missing leave a marker file.

    A FileStore reader polls the file and leaves no trace in it, so the marker
    ``<path>.<rank>.<phase>`` is the only sign that the reader is inside get or wait and has
    seen that what it waits for is not there yet.
    """
    parked, poll = _Parked(), store._poll

    def poll_and_mark(probe: Callable[[Any], Any], timeout: timedelta) -> Any:
        def probe_and_mark(table: Any) -> Any:
            result = probe(table)
            if result is None:
                open(f"{path}.{rank}.{parked.phase}", "a").close()
            return result
        return poll(probe_and_mark, timeout)

    store._poll = poll_and_mark  # type: ignore[method-assign]
    return parked


def _wait_parked(path: str, world_size: int, phase: str) -> None:
    wait_for(lambda: all(os.path.exists(f"{path}.{r}.{phase}") for r in range(1, world_size)),
             what=f"the other ranks to find the key missing in their {phase}")


def rendezvous_and_exchange(rank: int, world_size: int, url: str,
                            drop_env: tuple[str, ...] = (), extra_env: dict | None = None,
                            args: tuple[int, int] | None = None) -> tuple[int, int, list[bytes]]:
    """Rendezvous through ``url``; every rank publishes its rank and reads everyone's."""
    from ringtorch.rendezvous import rendezvous

    for name in drop_env:
        os.environ.pop(name, None)
    os.environ.update({k: v.format(rank=rank, world_size=world_size)
                       for k, v in (extra_env or {}).items()})
    gen = rendezvous(url, *args) if args else rendezvous(url)
    store, got_rank, got_world = next(gen)
    store.set(f"rank/{got_rank}", str(got_rank))
    seen = [store.get(f"rank/{r}") for r in range(got_world)]
    _leave(store, got_rank, got_world)
    try:
        next(gen)
    except RuntimeError as exc:
        seen.append(str(exc).encode())
    return got_rank, got_world, seen


def client_of_external_store(rank: int, world_size: int) -> bytes:
    """Connect to a store the test process hosts (MASTER_ADDR/MASTER_PORT point at it)."""
    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                     TIMEOUT)
    store.set(f"hello/{rank}", b"hi")
    return store.get("greeting")


def connect_and_report(rank: int, world_size: int) -> str:
    """Connect to the test process's store; return the error text (or "connected")."""
    try:
        TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                 timedelta(seconds=5))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "connected"


def tcp_with_query(rank: int, world_size: int, url: str) -> tuple[int, int, list[bytes]]:
    """rendezvous_and_exchange on a tcp:// URL template filled with this rank's values."""
    return rendezvous_and_exchange(rank, world_size, url.format(
        port=os.environ["MASTER_PORT"], rank=rank, world_size=world_size))


def tcp_with_arguments(rank: int, world_size: int) -> tuple[int, int, list[bytes]]:
    """rendezvous_and_exchange with rank and world size given as arguments, not in the URL."""
    return rendezvous_and_exchange(rank, world_size,
                                   f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                                   args=(rank, world_size))


def file_scheme(rank: int, world_size: int, path: str) -> tuple[int, int, list[bytes]]:
    """rendezvous_and_exchange through file://path."""
    return rendezvous_and_exchange(rank, world_size,
                                   f"file://{path}?rank={rank}&world_size={world_size}")

"""Building a group's mesh: a rank dials its higher peers several at once (one handshake after
another was most of the mesh's set-up time), and the mesh it returns is whole: every pair of
ranks holds both channels, each reaching the rank it names. Four ranks' meshes built by threads
of one process over one in-process store."""

from __future__ import annotations

import json
import threading
import time

import pytest

from ringtorch._wire import handshake, mesh_setup
from ringtorch._wire.mesh import PeerMesh
from ringtorch.store import HashStore

WORLD = 4


def _build(store: HashStore) -> list[PeerMesh]:
    meshes: list[PeerMesh | None] = [None] * WORLD
    errors: list[BaseException] = []

    def one(rank: int) -> None:
        try:
            meshes[rank] = mesh_setup.connect_mesh(store, rank, WORLD, "dial",
                                                   time.monotonic() + 30, "tcp")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return [m for m in meshes if m is not None]


def test_a_rank_dials_its_peers_at_once_and_the_mesh_is_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = handshake.client_handshake
    lock = threading.Condition()
    in_flight: dict[int, int] = {}
    most: dict[int, int] = {}

    def counting(sock, service, deadline, peer, info=b"", **kw):  # type: ignore[no-untyped-def]
        rank = json.loads(info)["rank"]
        with lock:
            in_flight[rank] = in_flight.get(rank, 0) + 1
            most[rank] = max(most.get(rank, 0), in_flight[rank])
            lock.notify_all()
            if rank == 0:  # rank 0 has 6 dials: wait (bounded) for a second one to start
                lock.wait_for(lambda: in_flight[0] >= 2, timeout=1)
        try:
            return real(sock, service, deadline, peer, info=info, **kw)
        finally:
            with lock:
                in_flight[rank] -= 1

    monkeypatch.setattr(handshake, "client_handshake", counting)
    meshes = _build(HashStore())
    try:
        assert most[0] >= 2, most  # one at a time, rank 0's first dial would wait alone
        for a in range(WORLD):
            for b in range(WORLD):
                if a == b:
                    continue
                for kind in ("coll", "p2p"):
                    out = getattr(meshes[a], kind)[b]
                    into = bytearray(2)
                    out.send((bytes([a, b]),))
                    getattr(meshes[b], kind)[a].recv_into(into)
                    assert into == bytes([a, b]), (kind, a, b)
    finally:
        for m in meshes:
            m.close()

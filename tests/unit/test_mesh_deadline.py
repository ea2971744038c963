"""A PeerMesh wait that has gone silent hands control back when its slow hook asks, not a
whole slice later: the last slice before a deadline ends at the deadline (G5 of
docs/design/failure-detection.md). Two ranks' meshes over socketpairs in one process; the
peer sends nothing (as a frozen rank would), the hook raises at the deadline."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from ringtorch._wire.channel import WAIT_SLICE_S, UnixChannel
from ringtorch._wire.mesh import COLL_HEADER, PeerMesh


class Deadline(Exception):
    pass


def _mesh_pair() -> tuple[PeerMesh, PeerMesh, list[socket.socket]]:
    coll_a, coll_b = socket.socketpair()
    p2p_a, p2p_b = socket.socketpair()
    socks = [coll_a, coll_b, p2p_a, p2p_b]
    a = PeerMesh(0, 2, [None, UnixChannel(coll_a, "rank 1", 64 * 1024, 1)],
                 [None, UnixChannel(p2p_a, "rank 1", None, 1)], [True, True])
    b = PeerMesh(1, 2, [UnixChannel(coll_b, "rank 0", 64 * 1024, 0), None],
                 [UnixChannel(p2p_b, "rank 0", None, 0), None], [True, True])
    return a, b, socks


def _hook_until(deadline: float, calls: list[float]):  # type: ignore[no-untyped-def]
    def hook(peers: list[int], waited: float) -> float:
        now = time.monotonic()
        calls.append(now)
        if now >= deadline:
            raise Deadline(f"waited {waited:.3f} s for {peers}")
        return deadline - now
    return hook


@pytest.mark.parametrize("nbytes", [64, 4 << 20])  # a receive alone; a send the peer never takes
def test_a_silent_wait_raises_at_its_deadline_not_a_slice_later(nbytes: int) -> None:
    a, b, socks = _mesh_pair()
    try:
        calls: list[float] = []
        start = time.monotonic()
        deadline = start + WAIT_SLICE_S + 0.3  # the last slice is 0.3 s, not a whole one
        a.on_slow_wait = _hook_until(deadline, calls)
        header = COLL_HEADER.pack(0xC1, 1, 1, 0, 0, 1, nbytes, nbytes)
        payload = np.zeros(nbytes, dtype=np.uint8)
        with pytest.raises(Deadline, match=r"^waited \d+\.\d{3} s for \[1\]$"):
            a.exchange([(1, header, payload)], [(1, header, np.empty(nbytes, dtype=np.uint8))])
        raised = time.monotonic()
        assert deadline <= raised <= deadline + 0.1, (raised - start, calls)
        assert len(calls) >= 2, calls  # after the first silent slice, then at the deadline
    finally:
        for mesh in (a, b):
            mesh.shutdown()
            mesh.close()
        for s in socks:
            s.close()

"""The handshake pool's counters (ringtorch/_wire/admission.py) as a reader sees them while
newcomers push the oldest connections out: a drop and the newcomer that caused it are one
step, so a full pool never reads as less than full."""

from __future__ import annotations

import logging
import socket
import sys
import threading

from ringtorch._wire.admission import HandshakePool


def test_a_full_pool_reads_full_while_newcomers_push_the_oldest_out() -> None:
    release = threading.Event()
    pool = HandshakePool("the test pool", 4, lambda sock, peer: release.wait(30),
                         lambda sock, peer, result: None, logging.getLogger("test.admission"))
    pairs = [socket.socketpair() for _ in range(200)]
    for ours, _ in pairs[:4]:
        pool.start(ours, "a stranger")
    assert pool.counts().in_flight == 4
    seen: list[tuple[int, int]] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():  # spins without sleeping on purpose: reads between any steps
            counts = pool.counts()
            seen.append((counts.in_flight, sum(counts.dropped.values())))

    reader = threading.Thread(target=read)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the reader runs between any two steps of a start
    try:
        reader.start()
        for ours, _ in pairs[4:]:
            pool.start(ours, "a stranger")
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(switch)
        release.set()
        pool.close()
        for ours, theirs in pairs:
            ours.close()
            theirs.close()
    assert seen, "the reader never ran"
    assert {in_flight for in_flight, _ in seen} == {4}
    drops = [dropped for _, dropped in seen]
    assert drops == sorted(drops) and drops[-1] <= 196
    assert pool.counts().dropped == {"handshake slots full": 196}

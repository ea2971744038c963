"""The socket algorithms' communication patterns, simulated in one process over a recording
``Link``: who sends to whom, how many frames and bytes, and how much scratch memory.

Each rank runs on a thread with its own ``RecordingLink``; links are joined by unbounded
in-memory queues (one per ordered pair of ranks, FIFO like a stream), so a send never blocks
and a wrong pattern shows as a receive that finds nothing (a deadlock in a real mesh) or a
frame of the wrong size. Results are checked against NumPy too. A world runs in milliseconds.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from ringtorch.collectives.algorithms.sockets import direct, recursive_doubling, ring, tree
from ringtorch.collectives.reduce_op import ReduceOp, byte_reducer

WORLDS = [1, 2, 3, 4, 5, 8]
SUM = byte_reducer(ReduceOp.SUM, torch.int64)
ITEM = 8  # int64


@dataclass
class Event:
    kind: str  # "send" or "recv"
    peer: int
    nbytes: int


@dataclass
class RecordingLink:
    """A ``Link`` that records every frame and the largest scratch buffer asked for."""

    rank: int
    size: int
    net: dict[tuple[int, int], queue.Queue[bytes]]
    events: list[Event] = field(default_factory=list)
    scratch_nbytes: int = 0

    def send(self, peer: int, data: np.ndarray) -> None:
        assert peer != self.rank, f"rank {self.rank} sends to itself"
        self.events.append(Event("send", peer, data.nbytes))
        self.net[self.rank, peer].put(data.tobytes())

    def recv(self, peer: int, into: np.ndarray) -> None:
        assert peer != self.rank, f"rank {self.rank} receives from itself"
        try:
            frame = self.net[peer, self.rank].get(timeout=5)
        except queue.Empty:
            raise AssertionError(f"rank {self.rank} waits for a frame rank {peer} never "
                                 f"sends: the pattern would deadlock") from None
        assert len(frame) == into.nbytes, (f"rank {self.rank} expects {into.nbytes} bytes from "
                                           f"rank {peer}, the frame has {len(frame)}")
        into[:] = np.frombuffer(frame, dtype=np.uint8)
        self.events.append(Event("recv", peer, into.nbytes))

    def exchange(self, sends: Sequence[tuple[int, np.ndarray]],
                 recvs: Sequence[tuple[int, np.ndarray]]) -> None:
        for peer, data in sends:
            self.send(peer, data)
        for peer, into in recvs:
            self.recv(peer, into)

    def scratch(self, nbytes: int) -> np.ndarray:
        self.scratch_nbytes = max(self.scratch_nbytes, nbytes)
        return np.empty(nbytes, dtype=np.uint8)

    def sent(self) -> list[Event]:
        return [e for e in self.events if e.kind == "send"]

    def received(self) -> list[Event]:
        return [e for e in self.events if e.kind == "recv"]


def simulate(world: int, body: Callable[[RecordingLink], Any]) -> list[RecordingLink]:
    """Run ``body(link)`` for every rank of a world on threads; every frame must be taken."""
    net: dict[tuple[int, int], queue.Queue[bytes]] = {
        (a, b): queue.Queue() for a in range(world) for b in range(world) if a != b}
    links = [RecordingLink(r, world, net) for r in range(world)]
    errors: list[BaseException] = []

    def run(link: RecordingLink) -> None:
        try:
            body(link)
        except BaseException as exc:  # reported in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(link,)) for link in links]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    if errors:
        raise errors[0]
    left = {pair: q.qsize() for pair, q in net.items() if q.qsize()}
    assert not left, f"frames sent but never received: {left}"
    return links


def inputs(world: int, numel: int) -> list[np.ndarray]:
    return [np.random.default_rng([numel, r]).integers(-50, 50, numel).astype(np.int64)
            for r in range(world)]


def as_bytes(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint8)


# -- ring ------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
def test_ring_all_reduce_sends_2_n_minus_1_frames_only_to_the_right_neighbour(world):
    numel = 12 * world  # divisible by the world: blocks of equal size
    data = inputs(world, numel)
    bufs = [d.copy() for d in data]
    links = simulate(world, lambda link: ring.all_reduce(
        link, as_bytes(bufs[link.rank]), SUM, ITEM, segment_nbytes=1 << 20))
    for r, link in enumerate(links):
        np.testing.assert_array_equal(bufs[r], np.sum(data, axis=0))
        assert len(link.sent()) == 2 * (world - 1)
        assert {e.peer for e in link.sent()} <= {(r + 1) % world}
        assert {e.peer for e in link.received()} <= {(r - 1) % world}
        # 2(n-1)/n of the buffer: the least any all_reduce can move
        assert sum(e.nbytes for e in link.sent()) == 2 * (world - 1) * numel * ITEM // world
        assert link.scratch_nbytes <= 1 << 20  # one segment at most


@pytest.mark.parametrize("world", [2, 3, 5])
def test_ring_all_reduce_pipelines_a_large_buffer_with_one_segment_of_scratch(world):
    segment = 4 * ITEM
    numel = 10 * world * 4 + 3  # ten chunks and a ragged last one
    data = inputs(world, numel)
    bufs = [d.copy() for d in data]
    links = simulate(world, lambda link: ring.all_reduce(
        link, as_bytes(bufs[link.rank]), SUM, ITEM, segment))
    chunks = math.ceil(numel / (world * 4))
    for r, link in enumerate(links):
        np.testing.assert_array_equal(bufs[r], np.sum(data, axis=0))
        assert len(link.sent()) == 2 * (world - 1) * chunks
        assert max(e.nbytes for e in link.sent()) <= segment
        assert link.scratch_nbytes == segment


@pytest.mark.parametrize("world", WORLDS)
def test_ring_all_gather_passes_each_block_n_minus_1_hops_to_the_right(world):
    data = inputs(world, 5)
    outs = [np.zeros(5 * world, dtype=np.int64) for _ in range(world)]
    links = simulate(world, lambda link: ring.all_gather(
        link, as_bytes(outs[link.rank]), as_bytes(data[link.rank])))
    for r, link in enumerate(links):
        np.testing.assert_array_equal(outs[r], np.concatenate(data))
        assert [(e.peer, e.nbytes) for e in link.sent()] == [((r + 1) % world, 5 * ITEM)] * (world - 1)
        assert link.scratch_nbytes == 0


@pytest.mark.parametrize("world", WORLDS)
def test_ring_reduce_scatter_moves_n_minus_1_blocks_right_and_leaves_the_input(world):
    segment = 3 * ITEM
    m = 7  # three segments per block: 3 + 3 + 1 elements
    data = inputs(world, m * world)
    kept = [d.copy() for d in data]
    outs = [np.zeros(m, dtype=np.int64) for _ in range(world)]
    links = simulate(world, lambda link: ring.reduce_scatter(
        link, as_bytes(outs[link.rank]), as_bytes(data[link.rank]), SUM, ITEM, segment))
    total = np.sum(kept, axis=0)
    for r, link in enumerate(links):
        np.testing.assert_array_equal(outs[r], total[r * m:(r + 1) * m])
        np.testing.assert_array_equal(data[r], kept[r])
        assert len(link.sent()) == (world - 1) * 3
        assert {e.peer for e in link.sent()} <= {(r + 1) % world}
        assert sum(e.nbytes for e in link.sent()) == (world - 1) * m * ITEM
        assert link.scratch_nbytes <= 3 * segment  # two partial segments and a landing one


@pytest.mark.parametrize("world", WORLDS)
def test_ring_reduce_adds_one_frame_per_rank_to_the_root(world):
    root = world - 1
    numel = 4 * world
    data = inputs(world, numel)
    bufs = [d.copy() for d in data]
    links = simulate(world, lambda link: ring.reduce(
        link, as_bytes(bufs[link.rank]), root, SUM, ITEM, 1 << 20))
    np.testing.assert_array_equal(bufs[root], np.sum(data, axis=0))
    for r, link in enumerate(links):
        # a reduce-scatter round the ring, then each finished block straight to the root
        peers = [e.peer for e in link.sent()]
        assert peers[:world - 1] == [(r + 1) % world] * (world - 1)
        assert peers[world - 1:] == ([root] if r != root else [])
        assert link.scratch_nbytes <= 1 << 20


# -- broadcast -------------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("root_of", [lambda n: 0, lambda n: n - 1], ids=["root0", "rootlast"])
def test_tree_broadcast_reaches_every_rank_once_in_log2_rounds(world, root_of):
    root = root_of(world)
    data = inputs(world, 9)
    links = simulate(world, lambda link: tree.broadcast_tree(link, as_bytes(data[link.rank]),
                                                             root))
    for r, link in enumerate(links):
        np.testing.assert_array_equal(data[r], data[root])
        assert len(link.received()) == (0 if r == root else 1)
    assert sum(len(link.sent()) for link in links) == world - 1
    assert len(links[root].sent()) == math.ceil(math.log2(world))
    # a rank's parent is its relative rank with the lowest set bit cleared
    for r, link in enumerate(links):
        vrank = (r - root) % world
        if vrank:
            parent = ((vrank & (vrank - 1)) + root) % world
            assert [e.peer for e in link.received()] == [parent]


@pytest.mark.parametrize("world", WORLDS)
def test_chain_broadcast_forwards_segment_by_segment_down_the_chain(world):
    root, segment = 1 % world, 16
    data = [as_bytes(d).copy() for d in inputs(world, 9)]  # 72 bytes: 5 segments (4 x 16 + 8)
    links = simulate(world, lambda link: tree.broadcast_chain(link, data[link.rank], root,
                                                              segment))
    pieces = [16, 16, 16, 16, 8] if world > 1 else []
    for r, link in enumerate(links):
        np.testing.assert_array_equal(data[r], data[root])
        v = (r - root) % world
        nxt, prev = (r + 1) % world, (r - 1) % world
        got = [(e.kind, e.peer, e.nbytes) for e in link.events]
        if world == 1:
            assert got == []
        elif v == 0:
            assert got == [("send", nxt, n) for n in pieces]
        elif v == world - 1:
            assert got == [("recv", prev, n) for n in pieces]
        else:  # piece k goes on before piece k + 1 has been received, except the first
            assert got[0] == ("recv", prev, 16)
            assert got[1::2] == [("send", nxt, n) for n in pieces]
            assert got[2::2] == [("recv", prev, n) for n in pieces[1:]]
        assert link.scratch_nbytes == 0


# -- recursive doubling and the barrier ------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
def test_recursive_doubling_exchanges_whole_buffers_log2_times_folding_the_rest(world):
    numel = 6
    data = inputs(world, numel)
    bufs = [d.copy() for d in data]
    links = simulate(world, lambda link: recursive_doubling.all_reduce(
        link, as_bytes(bufs[link.rank]), SUM))
    p2 = 1 << (world.bit_length() - 1)
    rem = world - p2
    for r, link in enumerate(links):
        np.testing.assert_array_equal(bufs[r], np.sum(data, axis=0))
        assert bufs[r].tobytes() == bufs[0].tobytes()
        assert {e.nbytes for e in link.events} <= {numel * ITEM}
        assert link.scratch_nbytes == numel * ITEM  # one partner's buffer
        if r < 2 * rem and r % 2 == 0:  # folded: hands its buffer over and gets the result
            assert [(e.kind, e.peer) for e in link.events] == [("send", r + 1), ("recv", r + 1)]
        else:
            rounds = int(math.log2(p2))
            extra = 2 if r < 2 * rem else 0  # takes a partner's buffer, gives the result back
            assert len(link.sent()) == rounds + extra // 2


@pytest.mark.parametrize("world", WORLDS)
def test_the_dissemination_barrier_signals_rank_plus_2_to_the_k_in_each_round(world):
    links = simulate(world, recursive_doubling.barrier)
    rounds = math.ceil(math.log2(world)) if world > 1 else 0
    for r, link in enumerate(links):
        assert [e.peer for e in link.sent()] == [(r + 2 ** k) % world for k in range(rounds)]
        assert [e.peer for e in link.received()] == [(r - 2 ** k) % world
                                                     for k in range(rounds)]
        assert {e.nbytes for e in link.events} <= {0}


# -- direct ----------------------------------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
def test_direct_all_reduce_sends_the_buffer_once_to_every_peer(world):
    numel = 5
    data = inputs(world, numel)
    bufs = [d.copy() for d in data]
    links = simulate(world, lambda link: direct.all_reduce(link, as_bytes(bufs[link.rank]),
                                                           SUM))
    for r, link in enumerate(links):
        np.testing.assert_array_equal(bufs[r], np.sum(data, axis=0))
        assert sorted(e.peer for e in link.sent()) == [p for p in range(world) if p != r]
        assert {e.nbytes for e in link.sent()} <= {numel * ITEM}
        assert link.scratch_nbytes == (world - 1) * numel * ITEM


@pytest.mark.parametrize("world", WORLDS)
def test_scatter_gather_all_reduce_moves_what_the_ring_moves_in_two_rounds(world):
    numel = 6 * world
    data = inputs(world, numel)
    bufs = [d.copy() for d in data]
    links = simulate(world, lambda link: direct.all_reduce_scatter_gather(
        link, as_bytes(bufs[link.rank]), SUM, ITEM, 1 << 20))
    for r, link in enumerate(links):
        np.testing.assert_array_equal(bufs[r], np.sum(data, axis=0))
        assert bufs[r].tobytes() == bufs[0].tobytes()
        assert len(link.sent()) == 2 * (world - 1)
        assert sum(e.nbytes for e in link.sent()) == 2 * (world - 1) * numel * ITEM // world


@pytest.mark.parametrize("world", WORLDS)
def test_direct_rooted_ops_talk_only_to_the_root(world):
    root = world // 2
    data = inputs(world, 4)
    bufs = [d.copy() for d in data]
    links = simulate(world, lambda link: direct.reduce(link, as_bytes(bufs[link.rank]), root,
                                                       SUM))
    np.testing.assert_array_equal(bufs[root], np.sum(data, axis=0))
    gathered = np.zeros(4 * world, dtype=np.int64)
    g_links = simulate(world, lambda link: direct.gather(
        link, as_bytes(gathered) if link.rank == root else None, as_bytes(data[link.rank]),
        root))
    np.testing.assert_array_equal(gathered, np.concatenate(data))
    outs = [np.zeros(4, dtype=np.int64) for _ in range(world)]
    full = np.concatenate(data)
    s_links = simulate(world, lambda link: direct.scatter(
        link, as_bytes(outs[link.rank]), as_bytes(full) if link.rank == root else None, root))
    for r in range(world):
        np.testing.assert_array_equal(outs[r], full[4 * r:4 * (r + 1)])
    for r in range(world):
        if r == root:
            assert links[r].sent() == [] and g_links[r].sent() == []
            assert sorted(e.peer for e in s_links[r].sent()) == [p for p in range(world) if p != r]
        else:
            assert [(e.peer, e.nbytes) for e in links[r].sent()] == [(root, 4 * ITEM)]
            assert [(e.peer, e.nbytes) for e in g_links[r].sent()] == [(root, 4 * ITEM)]
            assert [(e.peer, e.nbytes) for e in s_links[r].received()] == [(root, 4 * ITEM)]


@pytest.mark.parametrize("world", WORLDS)
def test_direct_all_to_all_sends_block_j_to_rank_j_only(world):
    def sizes(src: int) -> list[int]:  # elements src sends to each rank; some are empty
        return [(src + 2 * j) % 3 for j in range(world)]

    data = [np.arange(sum(sizes(r)), dtype=np.int64) + 100 * r for r in range(world)]
    recv_sizes = [[sizes(j)[r] for j in range(world)] for r in range(world)]
    outs = [np.zeros(sum(recv_sizes[r]), dtype=np.int64) for r in range(world)]

    def offsets(counts: list[int]) -> list[int]:
        return [ITEM * x for x in np.concatenate([[0], np.cumsum(counts)]).tolist()]

    links = simulate(world, lambda link: direct.all_to_all(
        link, as_bytes(outs[link.rank]), as_bytes(data[link.rank]),
        offsets(recv_sizes[link.rank]), offsets(sizes(link.rank))))
    for r, link in enumerate(links):
        expected = [data[j][sum(sizes(j)[:r]):sum(sizes(j)[:r + 1])] for j in range(world)]
        np.testing.assert_array_equal(outs[r], np.concatenate(expected))
        assert [(e.peer, e.nbytes) for e in link.sent()] == [
            (j, ITEM * sizes(r)[j]) for j in range(world) if j != r]

"""The p2p Mailbox over real Unix socket pairs, in one process: matching by (source, tag),
receives posted before or after the message arrives, failures that wake waiting receivers,
and its statistics() record (which the tests also wait on to order their events)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ringtorch._wire.channel import UnixChannel
from ringtorch._wire.errors import DeadlineExceeded
from ringtorch._wire.mailbox import ABORT, Mailbox, MailboxStatistics, RecvError
from ringtorch.testing import wait_for


@pytest.fixture
def boxes():
    """Three mailboxes (ranks 0, 1, 2) fully connected; events are recorded per rank."""
    chans: list[list] = [[None] * 3 for _ in range(3)]
    for a in range(3):
        for b in range(a + 1, 3):
            sa, sb = socket.socketpair()
            chans[a][b] = UnixChannel(sa, f"rank {b}")
            chans[b][a] = UnixChannel(sb, f"rank {a}")
    events: list[list] = [[], [], []]
    made = [Mailbox(r, chans[r], lambda p, k, d, r=r: events[r].append((p, k, d)), "t")
            for r in range(3)]
    for box in made:
        box.start()
    yield made, events
    for row in chans:
        for ch in row:
            if ch is not None:
                ch.shutdown()
                ch.close()


def test_messages_match_by_tag_and_keep_their_order_per_source(boxes):
    (m0, m1, _), _ = boxes
    deadline = time.monotonic() + 5
    for value, tag in ((b"a1", 1), (b"b2", 2), (b"c1", 1)):
        m0.send(1, tag, value, deadline)
    got = bytearray(2)
    assert m1.recv(got, 0, 2, deadline) == 0 and got == b"b2"
    assert m1.recv(got, 0, 1, deadline) == 0 and got == b"a1"
    assert m1.recv(got, 0, 1, deadline) == 0 and got == b"c1"


def test_a_receive_posted_first_gets_the_message_and_the_sender(boxes):
    (m0, m1, m2), _ = boxes
    got = bytearray(3)
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(src=m1.recv(got, None, 7,
                                                                    time.monotonic() + 5)))
    thread.start()
    wait_for(lambda: m1.statistics().waiting_receives == 1, what="the receive to be posted")
    m2.send(1, 7, b"xyz", time.monotonic() + 5)
    thread.join(5)
    assert box["src"] == 2 and got == b"xyz"


def test_a_size_mismatch_fails_the_receive_naming_both_sizes(boxes):
    (m0, m1, _), _ = boxes
    m0.send(1, 3, b"12345", time.monotonic() + 5)
    with pytest.raises(RecvError) as info:
        m1.recv(bytearray(4), 0, 3, time.monotonic() + 5)
    assert str(info.value.args[0]) == ("rank 0 sent 5 bytes with tag 3, but the matching receive "
                                       "buffer holds 4 bytes: sizes must match")


def test_a_receive_times_out_and_a_later_message_waits_for_the_next_receive(boxes):
    (m0, m1, _), _ = boxes
    with pytest.raises(DeadlineExceeded, match=r"^timed out receiving from rank 0 \(tag 9\)$"):
        m1.recv(bytearray(1), 0, 9, time.monotonic() + 0.1)
    m0.send(1, 9, b"!", time.monotonic() + 5)
    got = bytearray(1)
    m1.recv(got, 0, 9, time.monotonic() + 5)
    assert got == b"!"


def test_fail_wakes_waiting_receives_and_fails_later_ones(boxes):
    (_, m1, _), _ = boxes
    box: dict = {}

    def wait() -> None:
        try:
            m1.recv(bytearray(1), 0, 0, None)
        except RecvError as exc:
            box["error"] = exc.args[0]

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for(lambda: m1.statistics().waiting_receives == 1, what="the receive to be posted")
    m1.fail(RuntimeError("group aborted"))
    thread.join(5)
    assert str(box["error"]) == "group aborted"
    with pytest.raises(RecvError):
        m1.recv(bytearray(1), 2, 0, None)


def test_control_frames_and_eof_reach_the_event_handler(boxes):
    (m0, _, m2), events = boxes
    assert m0.send_control(2, ABORT, b"why")
    wait_for(lambda: events[2], what="rank 2's first event")
    assert events[2][0] == (0, "abort", b"why")
    m2._channels[1].shutdown()  # rank 2's connection to rank 1 ends: rank 2 reports EOF
    wait_for(lambda: len(events[2]) == 2, what="rank 2's second event")
    assert events[2][1][:2] == (1, "eof")


def test_a_message_sent_before_its_sender_left_is_still_delivered(boxes):
    (m0, m1, _), _ = boxes
    deadline = time.monotonic() + 5
    m0.send(1, 3, b"last words", deadline)
    m0.send(1, 4, b"!", deadline)
    assert m1.recv(bytearray(1), 0, 4, deadline) == 0  # one stream: tag 3 arrived before it
    m1.fail_peer(0, RuntimeError("rank 0 has closed its process group"))
    got = bytearray(10)
    assert m1.recv(got, 0, 3, deadline) == 0 and got == b"last words"
    with pytest.raises(RecvError) as failed:
        m1.recv(got, 0, 3, deadline)
    assert str(failed.value.args[0]) == "rank 0 has closed its process group"


def test_statistics_count_messages_per_peer_and_what_waits(boxes):
    (m0, m1, m2), _ = boxes
    deadline = time.monotonic() + 5
    m0.send(1, 1, b"a", deadline)
    m0.send(1, 1, b"b", deadline)
    m2.send(1, 1, b"c", deadline)
    wait_for(lambda: m1.statistics().buffered == 3, what="three messages buffered")
    m1.recv(bytearray(1), 0, 1, deadline)
    thread = threading.Thread(target=m1.recv, args=(bytearray(1), 2, 9, deadline))
    thread.start()
    wait_for(lambda: m1.statistics().waiting_receives == 1, what="the receive to be posted")
    assert m0.statistics() == MailboxStatistics(sent=(0, 2, 0), arrived=(0, 0, 0),
                                                delivered=(0, 0, 0), buffered=0,
                                                waiting_receives=0, failed=False, gone_peers=())
    assert m1.statistics() == MailboxStatistics(sent=(0, 0, 0), arrived=(2, 0, 1),
                                                delivered=(1, 0, 0), buffered=2,
                                                waiting_receives=1, failed=False, gone_peers=())
    m2.send(1, 9, b"d", deadline)
    thread.join(5)
    assert m1.statistics().delivered == (1, 0, 1) and m1.statistics().waiting_receives == 0

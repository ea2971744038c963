"""Every Channel implementation keeps the same contract (``ringtorch._wire.channel.Channel``).

``check_*`` functions take a connected pair ``(a, b)``; they run against TCP and Unix-socket
channels (and any later transport: add its ``make_pair`` to ``PAIRS``).
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable

import pytest

from ringtorch._wire.channel import Channel, TcpChannel, UnixChannel
from ringtorch._wire.errors import DeadlineExceeded, PeerClosedError
from ringtorch._wire.sockets import connect_tcp, listen_tcp, listen_unix
from ringtorch.testing import wait_for, wait_for_thread_in


def tcp_pair() -> tuple[Channel, Channel]:
    """(a, b) connected; each channel's ``peer`` names the other end ("tcp-b" is a's peer)."""
    listener = listen_tcp("127.0.0.1", 0)
    port = listener.getsockname()[1]
    client = connect_tcp("127.0.0.1", port, time.monotonic() + 5)
    server, _ = listener.accept()
    listener.close()
    return TcpChannel(client, "tcp-b"), TcpChannel(server, "tcp-a")


def unix_pair() -> tuple[Channel, Channel]:
    name = f"\0ringtorch-test-{os.getpid()}-{time.monotonic_ns()}"
    listener = listen_unix(name)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(name)
    server, _ = listener.accept()
    listener.close()
    return UnixChannel(client, "unix-b"), UnixChannel(server, "unix-a")


PAIRS = {"tcp": tcp_pair, "unix": unix_pair}
MakePair = Callable[[], tuple[Channel, Channel]]


@pytest.fixture(params=sorted(PAIRS))
def pair(request):
    a, b = PAIRS[request.param]()
    yield a, b
    a.close()
    b.close()


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # the test inspects it
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_channels_implement_the_protocol(pair):
    assert all(isinstance(ch, Channel) for ch in pair)


@pytest.mark.parametrize("nbytes", [1, 1000, 8 * 1024 * 1024])
def test_bytes_arrive_in_order_and_intact_in_both_directions(pair, nbytes):
    a, b = pair
    data = os.urandom(nbytes)
    for src, dst in ((a, b), (b, a)):
        got = bytearray(nbytes)
        thread, box = _in_thread(lambda dst=dst, got=got: dst.recv_into(got))
        src.send([data])
        thread.join(10)
        assert "error" not in box and bytes(got) == data


def test_scatter_gather_send_is_one_contiguous_piece(pair):
    a, b = pair
    a.send([b"head", memoryview(b"-middle-"), bytearray(b"tail"), b""])
    got = bytearray(16)
    b.recv_into(got)
    assert got == b"head-middle-tail"


def test_receive_reports_eof_naming_the_peer_and_what_arrived(pair):
    a, b = pair
    a.send([b"abc"])
    a.close()
    with pytest.raises(PeerClosedError, match=r"^connection to (tcp|unix)-a was closed while "
                                              r"receiving \(3 of 10 bytes arrived\): the peer "
                                              r"exited or was killed$"):
        b.recv_into(bytearray(10))


def test_send_to_a_closed_peer_raises_peer_closed(pair):
    a, b = pair
    b.close()
    with pytest.raises(PeerClosedError, match=r"^connection to (tcp|unix)-b was closed while "
                                              r"sending"):
        for _ in range(100):  # TCP may accept the first bytes before the reset arrives
            a.send([bytes(65536)])
            time.sleep(0.001)


def test_receive_with_a_deadline_gives_up_in_time(pair):
    _, b = pair
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"^timed out receiving from (tcp|unix)-a "
                                               r"\(0 of 4 bytes arrived\)$"):
        b.recv_into(bytearray(4), time.monotonic() + 0.2)
    assert 0.15 < time.monotonic() - start < 2.0


def test_send_with_a_deadline_gives_up_when_the_peer_does_not_read(pair):
    a, _ = pair
    with pytest.raises(DeadlineExceeded):
        a.send([bytes(64 * 1024 * 1024)], time.monotonic() + 0.3)


def test_shutdown_wakes_a_blocked_receive_from_another_thread(pair):
    _, b = pair
    thread, box = _in_thread(lambda: b.recv_into(bytearray(4)))
    wait_for_thread_in(thread, "recv_into")  # inside the receive (blocked: nothing comes)
    b.shutdown()
    thread.join(5)
    assert not thread.is_alive()
    assert isinstance(box.get("error"), PeerClosedError)
    assert "was shut down while receiving" in str(box["error"])


def test_shutdown_wakes_a_blocked_send(pair):
    a, _ = pair
    thread, box = _in_thread(lambda: a.send([bytes(64 * 1024 * 1024)]))
    wait_for_thread_in(thread, "send")  # inside the send (blocked: nobody reads)
    a.shutdown()
    thread.join(5)
    assert not thread.is_alive()
    assert isinstance(box.get("error"), PeerClosedError)


def test_data_already_received_survives_shutdown(pair):
    a, b = pair
    a.send([b"12345678"])
    assert select.select([b.fileno()], [], [], 5)[0], "the bytes never arrived"
    b.shutdown()
    got = bytearray(8)
    b.recv_into(got)
    assert got == b"12345678"


def test_nowait_calls_never_block(pair):
    a, b = pair
    view = memoryview(bytearray(8))
    assert b.recv_into_nowait(view) == 0
    assert a.send_nowait([memoryview(b"xy")]) == 2
    got = 0

    def both_bytes_arrived() -> bool:
        nonlocal got
        got += b.recv_into_nowait(view[got:])
        return got == 2

    wait_for(both_bytes_arrived, 2, "the 2 bytes sent to arrive")
    assert bytes(view[:2]) == b"xy"
    big = memoryview(bytes(64 * 1024 * 1024))
    sent = a.send_nowait([big])
    assert 0 < sent < len(big)  # the kernel takes what fits, the rest is left to the caller
    assert a.send_nowait([big[sent:]]) < len(big) - sent


def test_recv_some_scatters_what_arrived_and_can_return_at_once(pair):
    a, b = pair
    head, rest = memoryview(bytearray(2)), memoryview(bytearray(100))
    assert b.recv_some([head, rest], wait=False) == 0
    a.send([b"hello"])
    n = b.recv_some([head, rest])
    while n < 5:
        n += b.recv_some([rest[n - 2:]])
    assert bytes(head) == b"he" and bytes(rest[:3]) == b"llo"
    a.close()
    with pytest.raises(PeerClosedError):
        while True:
            b.recv_some([rest])

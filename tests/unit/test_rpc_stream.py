"""RPC messages on a socket pair: whole messages in, deadlines, broken streams, and copies
out of another process's memory. No RPC agent involved."""

from __future__ import annotations

import os
import socket
import threading
import time

import numpy as np
import pytest
import torch

from ringtorch._wire.errors import DeadlineExceeded, PeerClosedError
from ringtorch.distributed.rpc import _cma, messages
from ringtorch.distributed.rpc import _serialization as ser
from ringtorch.distributed.rpc._stream import (
    MessageReader,
    StalledError,
    build_parts,
    send_message,
)


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_messages_arrive_whole_and_in_order(pair) -> None:
    a, b = pair
    values = [("small", 1), ("tensor", torch.arange(100_000, dtype=torch.float64))]

    def send_all() -> None:
        for i, value in enumerate(values):
            parts, _ = build_parts(messages.CALL, 0, i + 1, (-1, -1), ser.encode(value, 1),
                                   False)
            send_message(a, parts, None, "peer")

    sender = threading.Thread(target=send_all)
    sender.start()
    reader = MessageReader(b, "peer")
    for i, value in enumerate(values):
        message = reader.read(time.monotonic() + 5)
        assert message.header.message_id == i + 1
        got = ser.decode(message.data, message.buffers, 0)
        assert got[0] == value[0]
    sender.join()
    assert torch.equal(got[1], values[1][1])


def test_no_message_before_the_deadline(pair) -> None:
    with pytest.raises(DeadlineExceeded, match=r"^no message from peer before the deadline$"):
        MessageReader(pair[1], "peer").read(time.monotonic() + 0.05)


def test_a_message_cut_short_past_the_deadline_breaks_the_stream(pair) -> None:
    a, b = pair
    a.sendall(messages.pack_header(messages.CALL, 0, 100, 1, -1, -1, 0) + b"x" * 10)
    with pytest.raises(StalledError, match=r"^peer stopped sending in the middle of a message$"):
        MessageReader(b, "peer").read(time.monotonic() + 0.05)


def test_a_closed_peer_is_reported(pair) -> None:
    a, b = pair
    a.close()
    with pytest.raises(PeerClosedError, match=r"^connection to peer was closed$"):
        MessageReader(b, "peer").read(None)


def test_garbage_is_not_a_message(pair) -> None:
    a, b = pair
    a.sendall(b"\x80\x05garbage that is not a header at all....")
    with pytest.raises(ValueError, match=r"^bad RPC message magic"):
        MessageReader(b, "peer").read(None)


def test_a_send_nobody_reads_fails_at_its_deadline(pair) -> None:
    a, _ = pair
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    big = np.zeros(8 << 20, dtype=np.uint8)
    with pytest.raises(StalledError, match=r"^peer stopped reading in the middle of a message$"):
        send_message(a, [memoryview(big)], time.monotonic() + 0.1, "peer")
    with pytest.raises(DeadlineExceeded, match=r"^peer did not accept a message before the "
                                               r"deadline$"):
        send_message(a, [b"more"], time.monotonic() + 0.05, "peer")


def test_a_memory_reference_from_a_peer_we_may_not_read_is_refused(pair) -> None:
    a, b = pair
    source = np.arange(1 << 18, dtype=np.uint8)
    encoded = ser.encode(source, 1)
    parts, by_reference = build_parts(messages.CALL, 0, 1, (-1, -1), encoded, True)
    assert by_reference and len(parts) == 2  # the buffer itself is not in the stream
    send_message(a, parts, None, "peer")
    with pytest.raises(ValueError, match="sent a memory reference this process cannot read"):
        MessageReader(b, "peer").read(None)


def test_buffers_by_reference_are_copied_out_of_the_senders_memory(pair) -> None:
    a, b = pair
    source = np.arange(1 << 18, dtype=np.uint32)
    pid = os.fork()
    if pid == 0:  # the sender: keeps its memory alive until the reader is done
        try:
            parts, _ = build_parts(messages.CALL, 0, 1, (-1, -1), ser.encode(source, 1), True)
            send_message(a, parts, None, "reader")
            a.recv(1)
        finally:
            os._exit(0)
    try:
        assert _cma.probe(pid, _cma.token())  # the child has the parent's token (fork)
        message = MessageReader(b, "sender", cma_pid=pid).read(time.monotonic() + 5)
        b.sendall(b"k")
    finally:
        os.waitpid(pid, 0)
    np.testing.assert_array_equal(ser.decode(message.data, message.buffers, 1), source)


def test_the_probe_refuses_ourselves_a_wrong_token_and_a_missing_process() -> None:
    token = _cma.token()
    assert not _cma.probe(os.getpid(), token)
    pid = os.fork()
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    try:
        assert not _cma.probe(pid, {**token, "token": "00" * 16})
        assert not _cma.probe(pid, None)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert not _cma.probe(pid, token)  # gone

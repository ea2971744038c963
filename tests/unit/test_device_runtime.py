"""The device runtime contract (ringtorch/_device/api.py), one set of test bodies for every
runtime: ``sim`` everywhere, ``cuda`` where a GPU is visible (marked gpu(1): deselected
elsewhere). The simulated runtime delays every op of its streams by a random few
milliseconds, so that work the contract leaves unordered finishes out of order; a body that
needs the device busy for a while enqueues ``busy`` (a spin on a GPU, a sleep in the sim).
Expected values are computed with torch on the host, independently of the runtime.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from ringtorch._device.api import DeviceRuntime
from ringtorch._device.sim import SimRuntime

N = 1 << 16
SLOW = 0.3  # seconds a stream is kept busy where a body must see it still running


def _make(name: str) -> DeviceRuntime:
    if name == "cuda":
        from ringtorch._device.cuda import CudaRuntime

        return CudaRuntime()
    rng = random.Random(0)
    lock = threading.Lock()

    def delay(kind: str) -> float:
        with lock:
            return rng.uniform(0.0, 0.01)

    return SimRuntime(delay=delay)


RUNTIMES = ["sim", pytest.param("cuda", marks=pytest.mark.gpu(1))]


@pytest.fixture(params=RUNTIMES)
def rt(request: pytest.FixtureRequest) -> Iterator[DeviceRuntime]:
    runtime = _make(request.param)
    yield runtime
    runtime.synchronize(0)


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.to("cpu")


def test_a_stream_runs_its_work_in_the_order_it_was_enqueued(rt: DeviceRuntime) -> None:
    x = rt.empty((N,), torch.float32, 0)
    stream = rt.new_stream(0)
    rt.launch(stream, lambda: x.fill_(1.0))
    rt.busy(stream, 0.05)
    rt.launch(stream, lambda: x.add_(2.0))
    rt.launch(stream, lambda: x.mul_(10.0))
    stream.synchronize()
    assert torch.equal(_host(x), torch.full((N,), 30.0))


def test_enqueuing_returns_before_the_work_runs(rt: DeviceRuntime) -> None:
    stream = rt.new_stream(0)
    rt.busy(stream, SLOW)
    assert not stream.query()
    stream.synchronize()
    assert stream.query()


def test_wait_stream_orders_work_across_streams(rt: DeviceRuntime) -> None:
    x = rt.empty((N,), torch.float32, 0)
    y = rt.empty((N,), torch.float32, 0)
    first, second = rt.new_stream(0), rt.new_stream(0)
    rt.launch(first, lambda: x.fill_(0.0))
    rt.launch(second, lambda: y.fill_(0.0))
    first.synchronize()
    second.synchronize()
    rt.busy(first, SLOW)
    rt.launch(first, lambda: x.fill_(5.0))
    second.wait_stream(first)
    rt.launch(second, lambda: y.copy_(x))
    second.synchronize()
    assert torch.equal(_host(y), torch.full((N,), 5.0))


def test_an_event_never_recorded_is_complete(rt: DeviceRuntime) -> None:
    event = rt.new_event()
    assert event.query()
    event.synchronize()  # returns at once


def test_an_event_captures_the_work_queued_when_it_is_recorded(rt: DeviceRuntime) -> None:
    stream = rt.new_stream(0)
    x = rt.empty((N,), torch.float32, 0)
    event = rt.new_event()
    rt.busy(stream, SLOW)
    rt.launch(stream, lambda: x.fill_(3.0))
    event.record(stream)
    assert not event.query()
    rt.busy(stream, SLOW)  # queued after the record: not part of the event
    event.synchronize()
    assert event.query()
    assert not stream.query()
    assert torch.equal(_host(x), torch.full((N,), 3.0))


def test_a_wait_placed_before_the_first_record_is_a_no_op(rt: DeviceRuntime) -> None:
    owner, waiter = rt.new_stream(0), rt.new_stream(0)
    event = rt.new_event()
    waiter.wait_event(event)  # nothing recorded yet: an empty set of work
    rt.busy(owner, SLOW)
    event.record(owner)
    rt.launch(waiter, lambda: None)
    waiter.synchronize()
    assert not owner.query()  # the waiter did not wait for the owner's later record
    waiter.wait_event(event)  # placed after the record: waits for it
    waiter.synchronize()
    assert owner.query()


def test_a_pinned_buffer_round_trips_through_the_device(rt: DeviceRuntime) -> None:
    expected = torch.arange(N, dtype=torch.float32)
    host_in = rt.pinned_empty((N,), torch.float32)
    host_out = rt.pinned_empty((N,), torch.float32)
    host_in.copy_(expected)
    host_out.zero_()
    device = rt.empty((N,), torch.float32, 0)
    stream = rt.new_stream(0)
    done = rt.new_event()
    rt.busy(stream, 0.05)
    rt.copy(device, host_in, stream)
    rt.launch(stream, lambda: device.mul_(2.0))
    rt.copy(host_out, device, stream)
    done.record(stream)
    done.synchronize()
    assert torch.equal(host_out, expected * 2.0)


def test_is_device_tells_device_memory_from_host_memory(rt: DeviceRuntime) -> None:
    x = rt.empty((4, 6), torch.float32, 0)
    assert rt.is_device(x) and rt.is_device(x[1:, ::2]) and rt.is_device(x.view(torch.int32))
    assert rt.device_index(x) == 0 and rt.device_index(x[2]) == 0
    assert not rt.is_device(torch.zeros(4, 6))
    assert not rt.is_device(rt.pinned_empty((4,), torch.float32))
    assert not rt.is_device(torch.zeros(4, 6).to_sparse())


def test_use_stream_makes_a_stream_current_for_the_block(rt: DeviceRuntime) -> None:
    stream = rt.new_stream(0)
    default = rt.current_stream(0)
    with rt.use_stream(stream):
        event = rt.new_event()
        rt.busy(stream, SLOW)
        event.record()  # on the current stream: ``stream``
        assert not event.query()
    assert rt.current_stream(0) == default
    event.synchronize()
    assert stream.query()


def _peer(runtime_name: str, buffer: Any, handle: bytes, conn: Any) -> None:
    """The second process: opens the owner's buffer and interprocess event; once told that
    the owner recorded, waits for the event on its stream, copies the owner's first half out
    and writes the second half."""
    try:
        rt = _make(runtime_name)
        shared = rt.open(buffer)
        event = rt.open_event(handle, 0)
        conn.send("opened")
        assert conn.recv() == "recorded 1"
        stream = rt.new_stream(0)
        mine = rt.empty((N // 2,), torch.float32, 0)
        stream.wait_event(event)  # device-side wait: the owner's fill is still queued
        rt.launch(stream, lambda: mine.copy_(shared[: N // 2]))
        rt.launch(stream, lambda: shared[N // 2:].fill_(9.0))
        stream.synchronize()
        conn.send(("read", _host(mine).numpy().copy()))  # plain pickle, no fd passing
    except BaseException as exc:  # the test's failure message
        conn.send(("error", repr(exc)))
        raise


def test_two_processes_exchange_device_memory_ordered_by_an_interprocess_event(
        rt: DeviceRuntime) -> None:
    shared = rt.empty((N,), torch.float32, 0)
    stream = rt.new_stream(0)
    rt.launch(stream, lambda: shared.zero_())
    stream.synchronize()
    event = rt.new_event(interprocess=True)
    ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA
    here, there = ctx.Pipe()
    peer = ctx.Process(target=_peer, args=(rt.name, rt.export(shared), event.ipc_handle(), there))
    peer.start()
    try:
        assert here.poll(120), "the peer did not open the buffer in 120 s"
        assert here.recv() == "opened"
        rt.busy(stream, SLOW)
        rt.launch(stream, lambda: shared[: N // 2].fill_(7.0))
        event.record(stream)
        here.send("recorded 1")  # the host-side handshake: the peer waits only after this
        assert here.poll(120), "the peer did not answer in 120 s"
        kind, value = here.recv()
        assert kind == "read", value
        assert torch.equal(torch.from_numpy(value), torch.full((N // 2,), 7.0))
        assert torch.equal(_host(shared[N // 2:]), torch.full((N // 2,), 9.0))
    finally:
        peer.join(60)
        if peer.is_alive():
            peer.kill()
    assert peer.exitcode == 0

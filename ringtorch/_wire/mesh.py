"""PeerMesh: a full mesh of channels between the ranks of one group, made through the store.

Each pair of ranks gets two connections: a *collective* channel, read inline by the thread
that runs the collective (no thread hand-off on the latency path), and a *p2p* channel read
by a reader thread (mailbox.py) so that point-to-point messages, aborts and status queries
arrive whatever the caller is doing. mesh_setup.py builds the mesh through the store (Unix
sockets between ranks of one host, TCP otherwise, every connection handshaken).

Collective data frame (little-endian), checked against what the receiver expects; the
fields are produced and decoded by collectives/call.py (the mesh compares bytes only):
    offset  0  u8   tag 0xC1 (a stream out of step shows up as a bad tag)
    offset  1  u8   op code (all_reduce, broadcast, ...)
    offset  2  u8   dtype code
    offset  3  u8   reduce op code (0xFF: none)
    offset  4  u32  root rank (0xFFFFFFFF: none)
    offset  8  u64  sequence number of the collective in its group
    offset 16  u64  total bytes of the collective's buffer on the sender
    offset 24  u64  payload bytes that follow this header
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ringtorch import _config
from ringtorch._errors import DistNetworkError
from ringtorch._wire.channel import WAIT_SLICE_S, Channel, wait_readable
from ringtorch._wire.errors import PeerClosedError, PeerUnreachableError

COLL_HEADER = struct.Struct("<BBBBIQQQ")
# A frame's payload or destination: anything exposing its memory through the buffer protocol
# (bytes, bytearray, memoryview, a NumPy array), as bytes or castable to them.
Payload = Any
_HEAD = COLL_HEADER.size
# A send the kernel did not take at once is handed to the sender thread from this size on
# (below it, the poll loop's few iterations cost less than a thread wake-up).
_HANDOFF_NBYTES = 128 * 1024
# The adaptive spin never drops below this (a few polls), so it can grow back.
_SPIN_FLOOR_S = 4e-6
# Called while a wait lasts, with the peers waited for and the seconds waited; returns how
# long the wait may go on before it must be called again (None: a whole slice). It may raise
# to end the wait (a deadline passed, the group was aborted).
SlowWaitHook = Callable[[list[int], float], "float | None"]
KIND_COLL = "coll"
KIND_P2P = "p2p"


class FrameMismatch(DistNetworkError):
    """A collective frame's header differs from the one the receiver expected.

    ``expected`` and ``got`` are the raw headers; the backend names their fields."""

    def __init__(self, peer: int, expected: bytes, got: bytes) -> None:
        super().__init__(f"frame from rank {peer} does not match the expected frame")
        self.peer = peer
        self.expected = expected
        self.got = got


class PeerLost(PeerClosedError):
    """A collective channel ended (the peer died, closed, or this mesh was shut down).

    ``unreachable`` is the reason in words when the network broke it (PeerUnreachableError),
    else ""."""

    def __init__(self, peer: int, message: str, unreachable: str = "") -> None:
        super().__init__(message)
        self.peer = peer
        self.unreachable = unreachable

    @classmethod
    def of(cls, peer: int, exc: PeerClosedError) -> PeerLost:
        """The PeerLost for ``exc``, raised by ``peer``'s channel."""
        reason = exc.reason if isinstance(exc, PeerUnreachableError) else ""
        return cls(peer, str(exc), reason)


def core_per_rank(local_ranks: int) -> bool:
    """Whether this host has a core for each of the group's ranks on it."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return local_ranks <= cores


def spin_seconds(local_ranks: int) -> float:
    """How long a receive polls before it blocks: RINGTORCH_SPIN_US while this host has a
    core per local rank; 0 when ranks outnumber cores (a spinning rank would steal the CPU
    its peer needs to send)."""
    return _config.SPIN_US.get() * 1e-6 if core_per_rank(local_ranks) else 0.0


def host_identity() -> str:
    """Which host this process runs on: ranks with equal identities share memory and Unix
    sockets. Hostname plus boot id (containers on one host share the boot id but not the
    hostname, and a reused hostname after a reboot gets a new boot id)."""
    override = _config.HOST_ID.get()
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            boot = fh.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


class PeerMesh:
    """The channels of one rank to every other rank of its group (see the module docstring).

    Attributes:
        coll: ``coll[peer]`` the collective channel to ``peer`` (None at ``rank``).
        p2p: ``p2p[peer]`` the point-to-point channel to ``peer`` (None at ``rank``).
        same_host: ``same_host[peer]`` whether ``peer`` shares this host.
        hosts: ``hosts[peer]`` the address ``peer``'s TCP connections come from, for a peer
            on another host ("" for one on this host, and at ``rank``): how errors name it.
    """

    def __init__(self, rank: int, size: int, coll: list[Channel | None],
                 p2p: list[Channel | None], same_host: list[bool],
                 hosts: list[str] | None = None) -> None:
        self.rank = rank
        self.size = size
        self.coll = coll
        self.p2p = p2p
        self.same_host = same_host
        self.hosts = hosts or [""] * size
        self.on_slow_wait: SlowWaitHook | None = None
        self.spin_s = spin_seconds(sum(same_host))
        self._spin_now = self.spin_s
        self._duplex_thread = core_per_rank(sum(same_host))
        self._head = memoryview(bytearray(_HEAD))
        self._sender = _Sender(f"ringtorch-send-{rank}")
        self._closed = False

    # -- collective frames -------------------------------------------------------------------

    def send(self, peer: int, header: bytes, payload: Payload) -> None:
        """Send one collective frame; returns once the kernel has it all."""
        self.coll[peer].send((header, payload))  # type: ignore[union-attr]

    def recv(self, peer: int, expected: bytes, into: Payload) -> None:
        """Receive one collective frame from ``peer`` into ``into``, checking its header.

        Raises:
            FrameMismatch: the header is not ``expected`` (nothing of the payload was read).
            PeerClosedError: the connection ended (peer died, or this mesh was shut down).
        """
        self.exchange((), ((peer, expected, into),))

    def exchange(self, sends: Sequence[tuple[int, bytes, Payload]],
                 recvs: Sequence[tuple[int, bytes, Payload]]) -> None:
        """Send and receive several frames at once without deadlocking on full buffers.

        First every send is offered without waiting; if the kernel took them all, the
        receives block one by one (one system call each when data is there). Otherwise one
        poll loop drives every stream. While a wait lasts more than a slice
        (``WAIT_SLICE_S``), ``on_slow_wait(peers, waited_s)`` is called at the end of each
        slice, or sooner when it asked to be (its return value: a deadline, a stall warning or
        a query due before the slice ends); it may raise to give up.
        """
        try:
            self._exchange(sends, recvs)
        except PeerLost:
            raise
        except PeerClosedError as exc:
            raise PeerLost.of(exc.peer, exc) from exc

    def _exchange(self, sends: Sequence[tuple[int, bytes, Payload]],
                  recvs: Sequence[tuple[int, bytes, Payload]]) -> None:
        pending = []
        for peer, header, payload in sends:
            ch = self.coll[peer]
            total = len(header) + memoryview(payload).nbytes
            try:
                sent = ch.send_nowait((header, payload))  # type: ignore[union-attr,arg-type]
            except PeerClosedError as exc:
                raise PeerLost.of(peer, exc) from exc
            if sent < total:
                views = [memoryview(header), memoryview(payload).cast("B")]
                pending.append(_Outgoing(ch, peer, views, sent))  # type: ignore[arg-type]
        if (len(pending) == 1 and len(recvs) <= 1 and self._duplex_thread
                and pending[0].remaining() >= _HANDOFF_NBYTES):
            # one big send and one receive (ring, chain, pairwise), a core per rank: the
            # sender thread pushes while this thread receives, both blocking in the kernel
            out = pending[0]
            self._sender.start(out.ch, out.peer, out.views)
            for peer, expected, into in recvs:
                self._recv_frame(peer, expected, into)
            self._sender.wait(out.peer, self._slow_hook)
            return
        if pending:
            incoming = [_Incoming(self.coll[p], p, e, i)  # type: ignore[arg-type]
                        for p, e, i in recvs]
            self._drive(pending, incoming)
            return
        for peer, expected, into in recvs:
            self._recv_frame(peer, expected, into)

    def _recv_frame(self, peer: int, expected: bytes, into: Payload) -> None:
        """Receive one frame with all sends done: scatter-read header and payload (one system
        call when the frame is there), spinning briefly before blocking (a blocking wake-up
        costs tens of microseconds on these machines)."""
        ch = self.coll[peer]
        head = self._head
        body = memoryview(into)
        if body.format != "B" or body.ndim != 1:
            body = body.cast("B")
        total = _HEAD + len(body)
        got = ch.recv_some((head, body), False)  # type: ignore[union-attr]
        if got == 0 and self._spin_now:
            got = self._spin(ch, head, body)  # type: ignore[arg-type]
        checked = False
        start = 0.0
        while True:
            if not checked and got >= _HEAD:
                if head != expected:
                    raise FrameMismatch(peer, expected, bytes(head))
                checked = True
            if got >= total:
                return
            views = (head[got:], body) if got < _HEAD else (body[got - _HEAD:],)
            # once the header is checked, wait for the whole payload inside the kernel
            # (MSG_WAITALL): no return to Python per arriving packet
            n = ch.recv_some(views, True, checked)  # type: ignore[union-attr]
            if n == 0:
                start = start or time.monotonic() - WAIT_SLICE_S
                self._slow_slices(ch.fileno(), [peer], start)  # type: ignore[union-attr]
            got += n

    def _spin(self, ch: Channel, head: memoryview, body: memoryview) -> int:
        """Poll for the frame up to the current spin budget. The budget adapts: it halves
        after a spin that found nothing (the peer is not running alongside us, e.g. the
        host is busy, and spinning would only keep it off a core) down to a few polls, and
        doubles back up to ``spin_s`` after a spin that found data."""
        budget = self._spin_now
        until = time.perf_counter() + budget
        got = 0
        while got == 0 and time.perf_counter() < until:
            got = ch.recv_some((head, body), False)
        if got:
            self._spin_now = min(self.spin_s, budget * 2)
        else:
            self._spin_now = max(_SPIN_FLOOR_S, budget / 2)
        return got

    def _slow_hook(self, peers: list[int], waited: float) -> float:
        """Tell the hook; the seconds until it wants to be told again (at most a slice)."""
        if self.on_slow_wait is None:
            return WAIT_SLICE_S
        left = self.on_slow_wait(peers, waited)
        return WAIT_SLICE_S if left is None else min(WAIT_SLICE_S, left)

    def _slow_slices(self, fd: int, peers: list[int], start: float) -> None:
        """A blocking receive found nothing for a whole slice: tell the hook, and while it
        wants control back sooner than a slice, wait for data that long in poll (the last
        slice before a deadline ends at the deadline). Returns when the stream has data
        (or ended: the next receive says so) or the next slice may block in the kernel."""
        left = self._slow_hook(peers, time.monotonic() - start)
        while left < WAIT_SLICE_S:
            if wait_readable(fd, left):
                return
            left = self._slow_hook(peers, time.monotonic() - start)

    def _drive(self, outgoing: list[_Outgoing], incoming: list[_Incoming]) -> None:
        self._poll_loop(select.poll(), time.monotonic(), outgoing, incoming)

    def _poll_loop(self, poller: Any, start: float, outgoing: list[_Outgoing],
                   incoming: list[_Incoming]) -> None:
        wake = 0.0  # once a slice passed in silence: when the hook wants control back
        while outgoing or incoming:
            masks: dict[int, int] = {}
            for out in outgoing:
                masks[out.fd] = masks.get(out.fd, 0) | select.POLLOUT
            for inc in incoming:
                masks[inc.fd] = masks.get(inc.fd, 0) | select.POLLIN
            for fd, mask in masks.items():
                poller.register(fd, mask)
            slice_s = WAIT_SLICE_S if not wake else max(0.0, wake - time.monotonic())
            ready = poller.poll(max(1, int(slice_s * 1000) + 1))
            for fd in masks:
                poller.unregister(fd)
            if not ready or (wake and time.monotonic() >= wake):
                now = time.monotonic()
                peers = sorted({i.peer for i in incoming} or {o.peer for o in outgoing})
                wake = now + self._slow_hook(peers, now - start)
                if not ready:
                    continue
            outgoing = [out for out in outgoing if not out.progress()]
            incoming = [inc for inc in incoming if not inc.progress()]

    # -- lifetime ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Wake every thread blocked on any channel of this mesh (from any thread)."""
        for ch in (*self.coll, *self.p2p):
            if ch is not None:
                ch.shutdown()

    def close(self) -> None:
        """Close every channel; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._sender.stop()
        for ch in (*self.coll, *self.p2p):
            if ch is not None:
                ch.close()


class _Sender:
    """A persistent thread that sends one large frame while the collective's thread receives
    (full duplex without a poll loop: each side blocks inside the kernel, which wakes it far
    less often than a poll loop that returns to Python for every arriving packet)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition()
        self._job: tuple[Channel, int, list[memoryview]] | None = None
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._stopped = False

    def start(self, ch: Channel, peer: int, views: list[memoryview]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, daemon=True, name=self._name)
            self._thread.start()
        self._done.clear()
        self._error = None
        with self._cond:
            self._job = (ch, peer, views)
            self._cond.notify()

    def wait(self, peer: int, slow_hook: Callable[[list[int], float], float]) -> None:
        start = time.monotonic()
        slice_s = WAIT_SLICE_S
        while not self._done.wait(slice_s):
            slice_s = slow_hook([peer], time.monotonic() - start)
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._job is None and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                ch, peer, views = self._job  # type: ignore[misc]
                self._job = None
            try:
                ch.send(views)
            except PeerClosedError as exc:
                self._error = PeerLost.of(peer, exc)
            except BaseException as exc:  # handed to the waiting collective
                self._error = exc
            finally:
                self._done.set()


class _Outgoing:
    """A frame being sent in pieces by the poll loop."""

    def __init__(self, ch: Channel, peer: int, views: list[memoryview], sent: int) -> None:
        self.ch = ch
        self.peer = peer
        self.fd = ch.fileno()
        self.views = views
        self._skip(sent)

    def remaining(self) -> int:
        return sum(len(v) for v in self.views)

    def _skip(self, sent: int) -> None:
        while sent:
            head = self.views[0]
            if sent >= len(head):
                sent -= len(head)
                self.views.pop(0)
            else:
                self.views[0] = head[sent:]
                sent = 0

    def progress(self) -> bool:
        try:
            self._skip(self.ch.send_nowait(self.views))
        except PeerClosedError as exc:
            raise PeerLost.of(self.peer, exc) from exc
        return not self.views


class _Incoming:
    """A frame being received: header first (checked), then payload into the destination."""

    def __init__(self, ch: Channel, peer: int, expected: bytes, into: Payload) -> None:
        self.ch = ch
        self.fd = ch.fileno()
        self.peer = peer
        self.expected = expected
        self.header = bytearray(COLL_HEADER.size)
        self.into = memoryview(into).cast("B")
        self.got = 0
        self.total = COLL_HEADER.size + len(self.into)

    def _view(self) -> memoryview:
        if self.got < COLL_HEADER.size:
            return memoryview(self.header)[self.got:]
        return self.into[self.got - COLL_HEADER.size:]

    def _check(self) -> None:
        if self.header != self.expected:
            raise FrameMismatch(self.peer, self.expected, bytes(self.header))

    def progress(self) -> bool:
        try:
            return self._progress()
        except PeerLost:
            raise
        except PeerClosedError as exc:
            raise PeerLost.of(self.peer, exc) from exc

    def _progress(self) -> bool:
        while self.got < self.total:
            n = self.ch.recv_into_nowait(self._view())
            if n == 0:
                return False
            before = self.got
            self.got += n
            if before < COLL_HEADER.size <= self.got:
                self._check()
        return True


__all__ = [
    "COLL_HEADER",
    "KIND_COLL",
    "KIND_P2P",
    "FrameMismatch",
    "PeerLost",
    "PeerMesh",
    "SlowWaitHook",
    "host_identity",
    "core_per_rank",
    "spin_seconds",
]

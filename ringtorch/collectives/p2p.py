"""Point-to-point operations of a ProcessGroup, and the monitored barrier built on them.

Sends and receives run on lanes keyed by (direction, peer, tag): messages between two ranks
with one tag stay in order (torch's matching rule), and a receive waiting for its message
never holds up a send, a receive from another peer, or a collective. A synchronous send or
receive on an idle lane runs on the caller's thread. A rank may ``isend`` to itself (torch
allows it): the message goes through a local mailbox, never the network.

The monitored barrier is gloo's algorithm on ringtorch's own (negative) tags: every rank
but 0 sends to rank 0, which waits for each with the barrier's timeout and then releases
them, so rank 0 can name the ranks that did not arrive.
"""

from __future__ import annotations

import collections
import threading
import time
from datetime import timedelta
from typing import Any

import torch

from ringtorch._errors import DistBackendError
from ringtorch._observe.operation import P2P, Operation
from ringtorch._observe.recorder import RECORDER
from ringtorch.collectives import checks, profiling
from ringtorch.collectives.comm_thread import Lane
from ringtorch.collectives.group_base import GroupBase
from ringtorch.collectives.work import Work

# Where the user's frame is, for the flight recorder (as group_base.SITE_DEPTH): _p2p (1),
# the group's method (2), ringtorch.distributed's helper (3) and public function (dist.send,
# 4). Elsewhere (torch's functions through the backend door) the recorder walks.
P2P_SITE_DEPTH = 4

_ARRIVED = 1
_FAILED = 0


def barrier_tags(seq: int) -> tuple[int, int]:
    """The (arrive, release) tags of the monitored barrier with sequence number ``seq``:
    negative, so they never meet a user's tag."""
    return -2 * seq - 1, -2 * seq - 2


class _SelfMailbox:
    """Messages a rank sends to itself, by tag, in order."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._boxes: dict[int, collections.deque[torch.Tensor]] = collections.defaultdict(
            collections.deque)
        self._closed: BaseException | None = None

    def close(self, reason: BaseException) -> None:
        """Wake every waiting receive with ``reason`` (the group was shut down)."""
        with self._cond:
            self._closed = reason
            self._cond.notify_all()

    def put(self, tag: int, tensor: torch.Tensor) -> None:
        with self._cond:
            self._boxes[tag].append(tensor.clone())
            self._cond.notify_all()

    def take(self, tag: int, into: torch.Tensor, deadline: float) -> None:
        with self._cond:
            while not self._boxes[tag]:
                if self._closed is not None:
                    raise DistBackendError(str(self._closed))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DistBackendError(f"recv from self (tag {tag}) timed out: no matching "
                                           f"isend to self")
                self._cond.wait(remaining)
            got = self._boxes[tag].popleft()
        if got.numel() != into.numel() or got.dtype != into.dtype:
            raise DistBackendError(f"recv from self (tag {tag}): sent {got.dtype}[{got.numel()}]"
                                   f", receiving into {into.dtype}[{into.numel()}]")
        into.copy_(got.view(into.shape))


class P2POps(GroupBase):
    """send, recv, recv_anysource and monitored_barrier of ProcessGroup."""

    def send(self, tensors: Any, dstRank: int, tag: int = 0, *,
             async_op: bool = True) -> Work:
        """Send ``tensors[0]`` to group rank ``dstRank``; matched by a recv with ``tag``."""
        t = checks.single("send", tensors)
        checks.contiguous_p2p(t)
        dst = checks.peer("send", dstRank, self._size, "destination")
        tag = checks.tag("send", tag)
        flat = _flat(t)
        if dst == self._rank:
            self._mailbox().put(tag, flat)
            done = Work("send", -1, None, [t], self._group_name)
            done.run()
            return done

        def run(o: Operation) -> None:
            self._backend_or_raise().send(flat, dst, tag, o.deadline)

        return self._p2p(("send", dst, tag), "send", run, [t], async_op)

    def recv(self, tensors: Any, srcRank: int, tag: int = 0, *,
             async_op: bool = True) -> Work:
        """Receive into ``tensors[0]`` from group rank ``srcRank`` (a send with ``tag``)."""
        t = checks.single("recv", tensors)
        checks.contiguous_p2p(t)
        src = checks.peer("recv", srcRank, self._size, "source")
        tag = checks.tag("recv", tag)
        flat = _flat(t)

        def run(o: Operation) -> int:
            if src == self._rank:
                self._mailbox().take(tag, flat, o.deadline)
                return src
            self._backend_or_raise().recv(flat, src, tag, o.deadline)
            return src

        return self._p2p(("recv", src, tag), "recv", run, [t], async_op)

    def recv_anysource(self, tensors: Any, tag: int = 0, *, async_op: bool = True) -> Work:
        """Receive into ``tensors[0]`` from whichever rank sends with ``tag`` first;
        ``work.source_rank()`` tells which."""
        t = checks.single("recv_anysource", tensors)
        checks.contiguous_p2p(t)
        tag = checks.tag("recv_anysource", tag)
        flat = _flat(t)

        def run(o: Operation) -> int:
            return int(self._backend_or_raise().recv(flat, None, tag, o.deadline))

        return self._p2p(("recv", None, tag), "recv_anysource", run, [t], async_op)

    def _p2p(self, key: tuple[str, int | None, int], op_name: str, run: Any,
             outputs: list[torch.Tensor], async_op: bool) -> Work:
        with self._p2p_lock:
            lane = self._p2p_lanes.get(key)
            if lane is None:
                lane = Lane(f"ringtorch-pg{self._group_name}-{key[0]}{key[1]}t{key[2]}",
                            pool=self._pool)
                self._p2p_lanes[key] = lane
        peer = -1 if key[1] is None else key[1]
        o = Operation(P2P, self._group_name, op_name,
                      outputs[0].numel() * outputs[0].element_size(), peer, f"tag {key[2]}")
        o.timeout = self._timeout_s  # its deadline is taken from this as it starts (Work.run)
        work = Work(op_name, -1, run, outputs, operation=o)
        if RECORDER.on:
            RECORDER.add(o, P2P_SITE_DEPTH)
        if profiling.profiler_on():
            o.profile = profiling.begin(self._backend_name, op_name, self._profile_id(),
                                        outputs, outputs, peer=peer)
            async_op = True  # its range ends on the lane's thread: asynchronous (profiling.py)
        lane.submit(work, inline=not async_op)
        return work

    def _mailbox(self) -> _SelfMailbox:
        with self._p2p_lock:
            if self._self_box is None:
                self._self_box = _SelfMailbox()
            return self._self_box

    def monitored_barrier(self, timeout: timedelta | None = None,
                          wait_all_ranks: bool = False) -> None:
        """A barrier in which rank 0 names the ranks that did not arrive within ``timeout``.

        Raises:
            DistBackendError: on rank 0, torch's texts: "[Rank 0]: Rank 2 failed to pass
                monitoredBarrier in 1000 ms", then the original exception ("Timed out waiting
                1000ms for rank 2 to reach monitoredBarrier: ...", or "Rank 0 timed out in
                monitoredBarrier after 1000 ms." where rank 0's time ran out before rank 2's
                turn); with ``wait_all_ranks``, every missing rank: "Ranks 1, 2 ..."; on the
                other ranks, that rank 0 reported a failure or could not be reached.
        """
        limit = timeout if timeout is not None else self._timeout
        if not isinstance(limit, timedelta):
            raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, "
                            f"got {limit}")

        def run(o: Operation) -> None:
            arrive, release = barrier_tags(o.seq)
            if self._rank == 0:
                self._barrier_root(limit, wait_all_ranks, arrive, release)
            else:
                self._barrier_member(limit, arrive, release)

        opts = _BarrierOpts(timeout=max(limit, self._timeout))
        self._collective("monitored_barrier", opts, run, [], []).wait()

    def _barrier_root(self, limit: timedelta, wait_all: bool, arrive: int, release: int) -> None:
        backend = self._backend_or_raise()
        ms = int(limit.total_seconds() * 1000)
        deadline = time.monotonic() + limit.total_seconds()
        arrived: list[int] = []
        failed: list[tuple[int, BaseException]] = []
        for rank in range(1, self._size):
            if not wait_all and not failed and time.monotonic() > deadline:
                # rank 0's own time ran out before this rank's turn: torch's words for it
                failed.append((rank, DistBackendError(_exhausted(ms, arrived))))
                continue
            # After the first failure (without wait_all) only collect who is already there,
            # so that they can be told at once instead of waiting out their timeout.
            until = deadline if wait_all or not failed else 0.0
            started = time.monotonic()
            try:
                backend.recv(torch.zeros(1, dtype=torch.int64), rank, arrive,
                             max(until, started + 0.001))
                arrived.append(rank)
            except Exception as exc:
                now = time.monotonic()
                if now >= until and not failed:  # torch's phrase for a wait that ran out
                    exc = DistBackendError(
                        f"Timed out waiting {round((now - started) * 1000)}ms for rank {rank} "
                        f"to reach monitoredBarrier: {exc}")
                failed.append((rank, exc))
        verdict = _FAILED if failed else _ARRIVED
        for rank in arrived:
            try:
                backend.send(torch.tensor([verdict], dtype=torch.int64), rank, release,
                             time.monotonic() + self._timeout.total_seconds())
            except Exception:
                pass
        if failed and wait_all:
            names = ", ".join(str(r) for r, _ in failed)
            raise DistBackendError(f"[Rank 0]: Ranks {names} failed to pass monitoredBarrier in "
                                   f"{ms} ms")
        if failed:
            rank, error = failed[0]
            raise DistBackendError(f"[Rank 0]: Rank {rank} failed to pass monitoredBarrier in "
                                   f"{ms} ms\n Original exception: \n{error}") from error

    def _barrier_member(self, limit: timedelta, arrive: int, release: int) -> None:
        backend = self._backend_or_raise()
        deadline = time.monotonic() + max(limit, self._timeout).total_seconds()
        answer = torch.zeros(1, dtype=torch.int64)
        try:
            backend.send(torch.tensor([_ARRIVED], dtype=torch.int64), 0, arrive, deadline)
            backend.recv(answer, 0, release, deadline)
            if int(answer.item()) != _ARRIVED:
                raise DistBackendError("rank 0 reported that some ranks did not arrive")
        except Exception as exc:
            raise DistBackendError(
                f"Rank {self._rank} successfully reached monitoredBarrier, but received errors "
                f"while waiting for send/recv from rank 0. Please check rank 0 logs for faulty "
                f"rank.\n Original exception: \n{exc}") from exc


def _exhausted(ms: int, arrived: list[int]) -> str:
    """torch's text for a monitored barrier whose time ran out on rank 0 between ranks."""
    processed = (f"Successfully processed ranks: {', '.join(str(r) for r in arrived)}"
                 if arrived else "No ranks successfully processed in monitoredBarrier.")
    return f"Rank 0 timed out in monitoredBarrier after {ms} ms.\n{processed}"


class _BarrierOpts:
    """Options of the monitored barrier's collective slot (synchronous)."""

    def __init__(self, timeout: timedelta) -> None:
        self.timeout = timeout
        self.asyncOp = False


def _flat(t: torch.Tensor) -> torch.Tensor:
    real = torch.view_as_real(t) if t.is_complex() else t
    return real.view(-1)


__all__ = ["P2POps", "barrier_tags"]

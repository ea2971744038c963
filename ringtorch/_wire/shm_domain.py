"""A same-host group's shared memory: one segment per rank, rounds, descriptors and waits.

Every rank of the group owns one segment (shm.py) and maps all the others (shm_setup.py). Ranks move in
lock-step *rounds*: to enter round t a rank finishes writing what it publishes for round t,
stores t in its round word, and waits until every peer's round word is at least t. The rules
that make the double-buffered data area safe without any other synchronisation:

* round t's data lives in slot ``t % 2`` of each segment's data area;
* a rank writes its slot for round t only after it has waited for round t - 1, and reads a
  peer's round-t data only after waiting for round t, finishing before it enters round t + 1
  — so nobody overwrites what someone may still read;
* data written after the round-t wait (a staged all_reduce's reduced slices) is read in round
  t + 1, in a part of the slot that round t + 2's writes leave alone; the collective then
  skips a round number (:meth:`ShmDomain.skip_round`) so the next collective's writes cannot
  reach it either.

Every collective also publishes a descriptor (sequence number, op, detail, bytes; any object
with those four attributes, the collectives layer's CollectiveCall is one): ``now``
(what the rank is doing, any transport) and, for its first shared-memory round, a per-slot
copy that every peer compares with its own after the round: ranks that called different
collectives, sizes, dtypes or roots fail at their first round, before any data is read, as does
a rank whose peer aborted before it arrived. ``now`` reports a rank stuck in a socket collective.

Waits spin on the peer's round word (0.3 µs a hand-off), then yield the CPU while yielding
is cheap, then sleep until the peer's signal wakes them (shm_wait.py). Every millisecond or
so a waiting rank also checks the ranks it waits for: alive (shm.py's lock probe), not
aborted, not in another collective, and the deadline. Knows bytes, never tensors.

Segment header (little-endian u64 words; what each rank writes into its *own* segment):

    offset    0  magic b"RTSHM\\0\\0\\1" as u64
    offset    8  layout version (1)
    offset   16  owner pid
    offset   24  half: bytes of each of the two data slots the owner offers
    offset   64  round: rounds entered so far (its own cache line; the signal)
    offset   72  sleepers: set to 1 by a peer about to sleep on the round word's futex;
                 the owner clears it and wakes them after storing a new round (futex.py)
    offset  128  aborted: 0, or 1 once the owner aborted the group
    offset  136  length of the abort reason; offset 144..399: reason, UTF-8
    offset  448  now descriptor: seq + 1 (0: none yet), kind, detail, nbytes (the first word
                 is written last and read before and after the others)
    offset  512  round descriptor of the op whose first round used slot 0 (same 4 words)
    offset  576  round descriptor, slot 1
    offset 1024  length of the name of the shared buffer being allocated; 1032..1151: the
                 name, UTF-8 (publish_name; read by the peers after the next round)
    offset 4096  data: slot 0 = [4096, 4096 + half), slot 1 = [4096 + half, 4096 + 2 half)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, NoReturn, Protocol

from ringtorch import _config
from ringtorch._errors import DistBackendError
from ringtorch._wire import futex, shm_wait
from ringtorch._wire.shm import PAGE, Segment

log = logging.getLogger(__name__)

MAGIC = int.from_bytes(b"RTSHM\0\0\1", "little")
VERSION = 1
W_MAGIC, W_VERSION, W_PID, W_HALF = 0, 1, 2, 3
W_ROUND, W_SLEEPERS = 8, 9
W_ABORTED, W_REASON_LEN = 16, 17
REASON_OFFSET, REASON_MAX = 144, 256
W_NOW, W_ROUND_DESC = 56, (64, 72)
W_NAME_LEN, NAME_OFFSET, NAME_MAX = 128, 1032, 120
DATA_OFFSET = 4096

INITIAL_HALF = 64 * 1024
SPIN_ITERS = 30            # ~2 µs of pure spinning before a wait starts yielding the CPU
SPIN_ITERS_PINNED = 20000  # ~1.5 ms when every rank has a CPU of its own (spin_long)
LEFT_GRACE_S = 0.25  # how long a peer's departure waits for its reason on the sockets


class Desc(NamedTuple):
    """What a collective is, as every rank must agree on it, as read from a peer's words.
    ``kind`` and ``detail`` are codes the caller defines (op; dtype, reduction, root)."""

    seq: int
    kind: int
    detail: int
    nbytes: int


class Descriptor(Protocol):
    """Anything with a descriptor's four words (Desc, or the caller's own call object)."""

    @property
    def seq(self) -> int: ...

    @property
    def kind(self) -> int: ...

    @property
    def detail(self) -> int: ...

    @property
    def nbytes(self) -> int: ...


class ShmReports(Protocol):
    """The words of the domain's failures, supplied by the layer that knows what the codes
    mean (collectives/reports.py). ``desc`` is a descriptor: ``seq``, ``kind``, ``detail``,
    ``nbytes``; ranks are given as the messages must name them."""

    def mismatch(self, mine: Descriptor, me: int, peer: int, theirs: Desc) -> str: ...

    def where(self, peer: int, theirs: Desc) -> str: ...

    def timed_out(self, desc: Descriptor, me: int, waited_s: float, late: list[int],
                  where: list[str]) -> str: ...

    def peer_aborted(self, desc: Descriptor, me: int, peer: int, reason: str) -> str: ...

    def peer_died(self, desc: Descriptor, me: int, peer: int, pid: int) -> str: ...

    def stalled(self, desc: Descriptor, me: int, waited_s: float, late: list[int],
                where: list[str]) -> str: ...

    def failed(self, desc: Descriptor, me: int, cause: str) -> str: ...


class ShmDomainStatistics(NamedTuple):
    """A snapshot of one rank's ShmDomain, for tests and diagnostics (trio's ``statistics()``).

    Attributes:
        collectives: collectives this rank entered through ``arrive``.
        rounds_entered: rounds this rank signalled (the first of each collective included).
        rounds_finished: rounds in which every peer arrived too.
        current: the descriptor this rank published last (``enter`` or ``arrive``), or None.
        waiting_on: the peer a wait of this rank is blocked on now, past its spin, or None.
        waits_slept: waits that went on past spinning and yielding to sleep.
        failed: the domain was aborted (later rounds raise).
        peers_ahead: peers (domain ranks) that signalled a round this rank has not finished:
            they wait for it (read from their segments, so it shows other processes' state).
    """

    collectives: int
    rounds_entered: int
    rounds_finished: int
    current: Descriptor | None
    waiting_on: int | None
    waits_slept: int
    failed: bool
    peers_ahead: tuple[int, ...]


class ShmPeerError(DistBackendError):
    """A shared-memory collective could not complete; ``ranks`` are the peers at fault."""

    def __init__(self, message: str, ranks: Sequence[int]) -> None:
        super().__init__(message)
        self.ranks = list(ranks)


class ShmDomain:
    """The mapped segments of one group whose ranks all share this host. Built by
    ``shm_setup.open_domain``.

    Attributes:
        rank, size: this rank and the group size.
        segments: ``segments[r]`` is rank r's segment (this rank's own at ``rank``).
        half: bytes of each data slot, the same on every rank (the smallest any rank offers).
        generation: incremented whenever mappings change (views built on them are stale).
        oversubscribed: more ranks here than CPUs this process may run on; waits yield at once.
        spread_out: the ranks together may run on at least as many CPUs as there are ranks
            (the same on every rank: from every rank's setup record); plans may rely on it.
        settings: rank 0's ``settings`` given to ``shm_setup.open_domain``.
        names: ``names[j]`` is how messages name member j (its group rank when the domain
            is one host's part of a larger group).
        poll_failure: optional callable a waiting rank polls every millisecond; a string it
            returns (another transport saw a peer die, say) fails the wait with that cause.
        await_failure: optional callable ``(timeout_s) -> cause or None`` that waits, with a
            bound, for another transport's cause (a departed peer's ABORT frame on its way).
        on_failure: optional callable given the message of every failure this domain raises,
            before it raises (the backend aborts the group with it).
    """

    def __init__(self, rank: int, size: int, segments: list[Segment], half_ceiling: int,
                 reports: ShmReports, group: str, names: Sequence[int] | None = None) -> None:
        self.rank, self.size = rank, size
        self.segments = segments
        self.words = [seg.buf.cast("Q") for seg in segments]
        self.peers = [r for r in range(size) if r != rank]
        self.half = INITIAL_HALF
        self.half_ceiling = max(INITIAL_HALF, half_ceiling)
        self.generation = 0
        self.round = 0
        self.reports = reports
        self.group = group
        self.names = list(names) if names is not None else list(range(size))
        self.oversubscribed = size > len(os.sched_getaffinity(0))
        self.spin_iters = 16 if self.oversubscribed else SPIN_ITERS
        self.spread_out = False  # every rank can have a CPU of its own (shm_setup sets it)
        self.settings: dict[str, int] = {}
        self.poll_failure: Callable[[], str | None] | None = None
        self.await_failure: Callable[[float], str | None] | None = None
        self.on_failure: Callable[[str], None] | None = None
        self._failure: str | None = None
        self._op_start = 0.0
        # The next stall warning, in seconds since _op_start (< 0: the knob is read on first
        # need, as reading the environment per collective costs more than its bookkeeping).
        self._warn_after = -1.0
        self._stats = {"collectives": 0, "entered": 0, "finished": 0, "slept": 0}
        self._current: Desc | None = None
        self._waiting_on: int | None = None
        self._yield_budget = shm_wait.YieldBudget()

    def statistics(self) -> ShmDomainStatistics:
        """What this rank's domain has done and is doing now (see ShmDomainStatistics)."""
        st = self._stats
        ahead = tuple(j for j in self.peers if self.words and self.words[j][W_ROUND] > self.round)
        return ShmDomainStatistics(st["collectives"], st["entered"], st["finished"],
                                   self._current, self._waiting_on, st["slept"],
                                   self._failure is not None, ahead)

    # -- descriptors and rounds ----------------------------------------------------------------

    def enter(self, desc: Descriptor) -> None:
        """Publish what this rank is doing now (every collective, whatever its transport)."""
        self._current = desc
        self._write_desc(W_NOW, desc)

    def arrive(self, desc: Descriptor, deadline: float, meanwhile: Callable[[], None] | None = None) -> None:
        """Enter the first round of collective ``desc``: publish it, wait for every peer and
        check that each peer is in the same collective. ``meanwhile``, when given, runs
        between the signal and the wait (private work that overlaps the peers' arrival).

        Raises:
            ShmPeerError: a peer is in another collective, died, aborted, or did not arrive
                before ``deadline``; the message names the ranks and their collectives.
        """
        t = self.round + 1
        self._op_start = time.monotonic()
        self._warn_after = -1.0
        self._current = desc
        self._stats["collectives"] += 1
        for j in self.peers:  # one that gave up (aborted) before this rank arrived: refuse
            if self.words[j][W_ABORTED]:
                self._fail(self.reports.peer_aborted(desc, self.names[self.rank], self.names[j],
                                                     self._reason(j)), [self.names[j]])
        self._write_desc(W_ROUND_DESC[t & 1], desc)
        self._write_desc(W_NOW, desc)
        self._signal_and_wait(t, desc, deadline, meanwhile)
        at = W_ROUND_DESC[t & 1]
        seq, kind, detail, nbytes = desc.seq + 1, desc.kind, desc.detail, desc.nbytes
        for j in self.peers:
            w = self.words[j]
            if w[at] != seq or w[at + 1] != kind or w[at + 2] != detail or w[at + 3] != nbytes:
                self._fail(self._mismatch(desc, j, self._read_desc(j, at)), [j])

    def step(self, desc: Descriptor, deadline: float, meanwhile: Callable[[], None] | None = None) -> None:
        """Enter the next round of the current collective (data published before; see module)."""
        self._signal_and_wait(self.round + 1, desc, deadline, meanwhile)

    def spin_long(self) -> None:
        """Every rank is bound to a CPU of its own (shm_setup.pinned_apart): a waiting rank
        can never hold the CPU its peer needs, so it spins ~1.5 ms before yielding. (Yielding
        early hands the CPU to whatever else runs on the machine, for a whole time slice.)"""
        self.spin_iters = SPIN_ITERS_PINNED

    def skip_round(self) -> None:
        """Leave one round number unused (every rank alike, no waiting).

        A collective that reads data a round after it was written (the staged all_reduce
        collects round t's reduced slices during round t + 1) calls this last, so that the
        next collective's first writes go to the other slot than the one still being read.
        """
        self.round += 1

    def _signal_and_wait(self, t: int, desc: Descriptor, deadline: float,
                         meanwhile: Callable[[], None] | None) -> None:
        if self._failure is not None:
            raise DistBackendError(self._failure)
        self._stats["entered"] += 1
        words = self.words
        own = words[self.rank]
        own[W_ROUND] = t
        if own[W_SLEEPERS]:  # a peer sleeps on our round word: wake it now
            own[W_SLEEPERS] = 0
            futex.wake(self._round_addr(self.rank))
        if meanwhile is not None:
            meanwhile()
        for j in self.peers:
            if words[j][W_ROUND] < t:
                self._wait_peer(j, t, desc, deadline)
        self.round = t
        self._stats["finished"] += 1

    def _wait_peer(self, j: int, t: int, desc: Descriptor, deadline: float) -> None:
        word = self.words[j]
        for _ in range(self.spin_iters):
            if word[W_ROUND] >= t:
                return
        self._waiting_on = j
        try:
            self._wait_peer_long(j, t, desc, deadline)
        finally:
            self._waiting_on = None

    def _wait_peer_long(self, j: int, t: int, desc: Desc, deadline: float) -> None:
        if shm_wait.wait_round(self.words[j], W_ROUND, W_SLEEPERS, t,
                               lambda: self._round_addr(j), self._yield_budget,
                               lambda now: self._check_late(t, desc, deadline, now)):
            self._stats["slept"] += 1

    def _explained_by_sockets(self, desc: Descriptor) -> None:
        """A peer left: if it aborted the group on its sockets first (an ABORT frame, read by
        another thread, may still be on its way), fail with that cause, the real culprit,
        rather than with "rank j left"; wait for it at most LEFT_GRACE_S."""
        if self.await_failure is None:
            return
        external = self.await_failure(LEFT_GRACE_S)
        if external is not None:
            self._fail(self.reports.failed(desc, self.names[self.rank], external), [])

    def _round_addr(self, j: int) -> int:
        """Address of rank j's round word in this process, from its current mapping (a
        segment that grew moved); only the sleep and wake paths need it, so not cached."""
        return futex.address_of(self.segments[j].buf, 8 * W_ROUND)

    def _check_late(self, t: int, desc: Descriptor, deadline: float, now: float) -> None:
        """Raise if this wait cannot end well: a late peer died, aborted or is elsewhere.
        A peer's round word is read again after its state: one that arrived in between
        (and then finished and closed its group, on a loaded machine) is not late."""
        if self._failure is not None:
            raise DistBackendError(self._failure)
        external = self.poll_failure() if self.poll_failure is not None else None
        me = self.names[self.rank]
        if external is not None:
            self._fail(self.reports.failed(desc, me, external), [])
        late = [j for j in self.peers if self.words[j][W_ROUND] < t]
        for j in list(late):
            name, aborted = self.names[j], self.words[j][W_ABORTED]
            theirs, alive = self._read_desc(j, W_NOW), self.segments[j].owner_alive()
            if self.words[j][W_ROUND] >= t:
                late.remove(j)
                continue
            if aborted:
                self._fail(self.reports.peer_aborted(desc, me, name, self._reason(j)), [name])
            if theirs.seq == desc.seq and (theirs.kind, theirs.detail, theirs.nbytes) != (
                    desc.kind, desc.detail, desc.nbytes):
                self._fail(self._mismatch(desc, j, theirs), [name])
            if not alive:
                self._explained_by_sockets(desc)
                self._fail(self.reports.peer_died(desc, me, name, self.words[j][W_PID]), [name])
        waited = now - self._op_start
        if late and self._warn_after < 0:
            self._warn_after = _config.STALL_WARNING_S.get()
        if late and (now > deadline or waited >= self._warn_after):
            where = [self.reports.where(self.names[j], self._read_desc(j, W_NOW)) for j in late]
            names = [self.names[j] for j in late]
            if now > deadline:
                self._fail(self.reports.timed_out(desc, me, waited, names, where), names)
            # the stall warning, again at twice the wait each time (a frozen peer, SIGSTOP or
            # a long C call, stays named while the timeout is far)
            self._warn_after = 2 * waited
            log.warning("%s", self.reports.stalled(desc, me, waited, names, where))

    # -- growth --------------------------------------------------------------------------------

    def ensure_half(self, needed: int, desc: Descriptor, deadline: float) -> int:
        """Grow every rank's data slots to at least ``needed`` bytes if the cap allows;
        returns the slot size now in force (the same on every rank).

        Growth is one extra round: each rank grows its own segment first (keeping its size if
        the memory cannot be reserved), publishes what it got, and after the round everyone
        takes the smallest offer and maps the peers' new sizes. All ranks call this with the
        same arguments, so they grow at the same points.
        """
        if needed <= self.half or self.half >= self.half_ceiling:
            return self.half
        target = min(max(_round_up(needed, PAGE), 2 * self.half), self.half_ceiling)
        own = self.segments[self.rank]
        offer = target if own.grow(DATA_OFFSET + 2 * target) else self.half
        self.words[self.rank] = own.buf.cast("Q")
        self.words[self.rank][W_HALF] = offer
        self.arrive(desc, deadline)
        agreed = min(self.words[r][W_HALF] for r in range(self.size))
        for j in self.peers:
            self.segments[j].remap()
            self.words[j] = self.segments[j].buf.cast("Q")
        if agreed < target:
            self.half_ceiling = agreed  # some rank is out of memory: stop trying
        self.half = agreed
        self.generation += 1
        return agreed

    def publish_name(self, name: str) -> None:
        """Publish a name (a shared buffer's segment) in this rank's header; the peers read it
        with :meth:`peer_name` after the next round, and it is not written again before the
        round after that has been waited for (so never while a peer may read it)."""
        data = name.encode()
        if len(data) > NAME_MAX:
            raise ValueError(f"name {name!r} is longer than {NAME_MAX} bytes")
        own = self.segments[self.rank]
        own.buf[NAME_OFFSET:NAME_OFFSET + len(data)] = data
        self.words[self.rank][W_NAME_LEN] = len(data)

    def peer_name(self, j: int) -> str:
        """The name rank j published for the round just waited for ("" for none)."""
        n = min(self.words[j][W_NAME_LEN], NAME_MAX)
        return bytes(self.segments[j].buf[NAME_OFFSET:NAME_OFFSET + n]).decode(errors="replace")

    def slot_offset(self, t: int) -> int:
        """Byte offset, in every segment, of the data slot that round ``t`` uses."""
        return DATA_OFFSET + (t & 1) * self.half

    # -- failure -------------------------------------------------------------------------------

    def abort(self, reason: str) -> None:
        """Tell every peer (through this rank's segment) that the group is aborted; later
        rounds raise here. Safe to call from any thread."""
        if self._failure is None:
            self._failure = reason
        data = reason.encode()[:REASON_MAX]
        own = self.segments[self.rank]
        if own.size:
            own.buf[REASON_OFFSET:REASON_OFFSET + len(data)] = data
            self.words[self.rank][W_REASON_LEN] = len(data)
            self.words[self.rank][W_ABORTED] = 1

    def fail(self, message: str, ranks: Sequence[int]) -> NoReturn:
        """Abort the group with ``message`` (peers see it within a millisecond, the backend
        is told through ``on_failure``) and raise it."""
        self._fail(message, ranks)

    def _fail(self, message: str, ranks: Sequence[int]) -> NoReturn:
        self.abort(message)
        if self.on_failure is not None:
            self.on_failure(message)
        raise ShmPeerError(message, ranks)

    def close(self) -> None:
        """Unmap every segment (this rank's lock goes with it, which peers see as leaving)."""
        for view in self.words:
            view.release()
        self.words = []
        for seg in self.segments:
            seg.close()

    # -- helpers -------------------------------------------------------------------------------

    def _mismatch(self, mine: Descriptor, j: int, theirs: Desc) -> str:
        return self.reports.mismatch(mine, self.names[self.rank], self.names[j], theirs)

    def _reason(self, j: int) -> str:
        n = min(self.words[j][W_REASON_LEN], REASON_MAX)
        return bytes(self.segments[j].buf[REASON_OFFSET:REASON_OFFSET + n]).decode(errors="replace")

    def _write_desc(self, at: int, desc: Descriptor) -> None:
        w = self.words[self.rank]
        w[at + 1], w[at + 2], w[at + 3] = desc.kind, desc.detail, desc.nbytes
        w[at] = desc.seq + 1  # 0 means "no collective yet"

    def _read_desc(self, j: int, at: int) -> Desc:
        """Rank j's descriptor at word ``at`` (seq -1: none yet), never torn."""
        w = self.words[j]
        while True:
            stamp = w[at]
            desc = Desc(stamp - 1, w[at + 1], w[at + 2], w[at + 3])
            if w[at] == stamp:
                return desc


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


__all__ = ["DATA_OFFSET", "INITIAL_HALF", "Desc", "Descriptor", "ShmDomain",
           "ShmDomainStatistics", "ShmPeerError", "ShmReports"]

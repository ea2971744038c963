"""The shared-memory workspace the shm_* algorithms run in: the group's domain, views, knobs.

Algorithms see every rank's data slots as uint8 NumPy arrays (built once per (rank, offset,
length) and cached until the mappings change), copy with NumPy and reduce with the ByteReducer
of reduce_op.py. Everything here works on bytes, like the socket algorithms.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ringtorch._wire.shm_domain import Descriptor, ShmDomain
from ringtorch.collectives.algorithms.shm.plan import Plan, area_offset, plan, wanted_half
from ringtorch.collectives.reduce_op import ByteReducer, combiner_of

_MAX_CACHED_VIEWS = 4096
_MAX_CACHED_PLANS = 1024
SHARED_CPU_CHUNK_FACTOR = 4  # staged all_reduce chunks when ranks share CPUs (see plan)


class ShmSpace:
    """A ShmDomain plus cached NumPy views of its data slots and the size knobs.

    Attributes:
        domain: the ShmDomain (rounds, waits, growth).
        chunk_nbytes: bytes per round of a large collective.
        oneshot_nbytes: all_reduce up to this size takes one round.
    """

    def __init__(self, domain: ShmDomain, chunk_nbytes: int, oneshot_nbytes: int) -> None:
        self.domain = domain
        self.chunk_nbytes = chunk_nbytes
        self.oneshot_nbytes = oneshot_nbytes
        self._views: dict[tuple[int, int, int], np.ndarray] = {}
        self._plans: dict[tuple[str, int, int], tuple[int, Plan]] = {}
        self._generation = domain.generation

    @property
    def rank(self) -> int:
        return self.domain.rank

    @property
    def size(self) -> int:
        return self.domain.size

    def view(self, owner: int, offset: int, nbytes: int) -> np.ndarray:
        """``nbytes`` of rank ``owner``'s segment at byte ``offset``, as a uint8 array."""
        if self._generation != self.domain.generation or len(self._views) > _MAX_CACHED_VIEWS:
            self._views.clear()
            self._generation = self.domain.generation
        key = (owner, offset, nbytes)
        found = self._views.get(key)
        if found is None:
            found = np.frombuffer(self.domain.segments[owner].buf, np.uint8, nbytes, offset)
            self._views[key] = found
        return found

    def next_slot(self) -> int:
        """Byte offset of the data slot of the next round (the one this rank fills now)."""
        return self.domain.slot_offset(self.domain.round + 1)

    def next_area(self, steps: Plan) -> int:
        """Byte offset of where this rank writes in the next round: the next slot, at the
        plan's rotating area when it has one (plan.area_offset), else at its start."""
        base = self.next_slot()
        if steps.area:
            base += area_offset(steps, self.domain.round + 1, self.domain.half)
        return base

    def round(self, first: bool, desc: Descriptor, deadline: float,
              meanwhile: Callable[[], None] | None = None) -> None:
        """Enter the next round: the collective's first (checked against the peers) or a later
        one; ``meanwhile`` runs between this rank's signal and its wait (ShmDomain.arrive)."""
        if first:
            self.domain.arrive(desc, deadline, meanwhile)
        else:
            self.domain.step(desc, deadline, meanwhile)

    def plan(self, op: str, nbytes: int, itemsize: int, desc: Descriptor, deadline: float) -> Plan:
        """The plan of ``op`` on ``nbytes``, after growing the slots if it wants more room
        (every rank grows at the same call). Plans are cached while the slot size holds."""
        key = (op, nbytes, itemsize)
        found = self._plans.get(key)
        if found is not None and found[0] == self.domain.half:
            return found[1]
        rotate = self.domain.spread_out
        chunk = self.chunk_nbytes
        if op == "all_reduce" and not rotate:
            # ranks share CPUs: every round may wait for a rank to be scheduled, so a staged
            # all_reduce takes a quarter as many (world 3 on 2 cores, 16 MB: 31-40 ms instead
            # of 43-60 ms)
            chunk *= SHARED_CPU_CHUNK_FACTOR
        want = wanted_half(op, nbytes, self.size, chunk, self.oneshot_nbytes, rotate)
        half = self.domain.ensure_half(want, desc, deadline)
        made = plan(op, nbytes, itemsize, self.size, half, chunk, self.oneshot_nbytes, rotate)
        if len(self._plans) > _MAX_CACHED_PLANS:
            self._plans.clear()
        self._plans[key] = (half, made)
        return made

    def close(self) -> None:
        self._views.clear()
        self._plans.clear()


def reduce_in_rank_order(dst: np.ndarray, operands: Sequence[np.ndarray], dst_holds: int,
                         reduce: ByteReducer) -> None:
    """``dst = x_0 (op) x_1 (op) ... (op) x_{p-1}``, left to right, whoever computes it.

    ``operands[j]`` is rank j's operand. ``dst_holds`` says which operand ``dst`` already
    holds (it may be ``operands[dst_holds]`` itself), or -1; when it is 2 or more, ``dst`` is
    overwritten first, so ``operands[dst_holds]`` must then be a separate copy; otherwise
    ``dst`` receives ``x_0 (op) x_1`` in one pass (the reducer's three-operand form), and no
    operand may partly overlap it. Computing in
    rank order everywhere makes every rank's result bitwise identical to every other's and to
    a plain left-to-right reduction of the inputs.
    """
    p = len(operands)
    if not dst.nbytes:
        return
    combine = combiner_of(reduce) if p >= 2 else None
    if dst_holds == 0:
        start = 1
    elif dst_holds == 1:
        reduce(dst, operands[0], True)
        start = 2
    elif combine is not None:  # one pass: dst = x_0 (op) x_1, no copy of x_0 first
        combine(dst, operands[0], operands[1])
        start = 2
    else:
        np.copyto(dst, operands[0])
        start = 1
    for j in range(start, p):
        reduce(dst, operands[j], False)


__all__ = ["ShmSpace", "reduce_in_rank_order"]

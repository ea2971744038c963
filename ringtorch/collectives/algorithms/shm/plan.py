"""Pure planning for the shared-memory collectives: how big a round is, where chunks fall.

Every rank calls these with the same arguments (the collective's size, the group size and the
slot size in force, which is the same everywhere) and gets the same plan; that is what keeps
the ranks' rounds in step. Ranges are half-open byte ranges ``(start, stop)`` that never split
an element, and pieces that several ranks write side by side start on 64-byte lines where the
sizes allow, so that no two ranks write the same cache line.
"""

from __future__ import annotations

from dataclasses import dataclass

LINE = 64
PAGE = 4096
# One-round collectives of these sizes write a different area of their slot each time, out of
# ROTATE_HALF: the area a rank writes is then no longer in its peers' caches (they read it
# 64 calls of 64 KiB ago), and writing lines a peer still caches is what costs (a 64 KiB
# copy: ~30 µs into lines the peer just read, ~9 µs into lines it no longer holds; 2 MB:
# 0.75 ms instead of 1.2-1.3 ms for the whole all_reduce at load 6).
ROTATE_MIN, ROTATE_MAX = 16 * 1024, 2 * 1024 * 1024
ROTATE_HALF = 4 * 1024 * 1024
ONESHOT_MANY_RANKS = 512 * 1024  # a one-shot all_reduce's reads cap from 3 ranks up


@dataclass(frozen=True)
class Plan:
    """How one collective moves through the data slots.

    Attributes:
        chunks: byte ranges of the per-rank message (or of each per-rank piece), one per round.
        chunk_nbytes: the largest chunk; the slot holds ``slot_factor`` of them per round.
        oneshot: the all_reduce is done in one round, every rank reducing everything.
        area: a one-round collective (one-shot all_reduce, one-chunk broadcast, all_gather,
            reduce_scatter) writes one of the slot's ``half // area`` areas of this many bytes,
            a different one each call (:func:`area_offset`); 0: offset 0.
    """

    chunks: tuple[tuple[int, int], ...]
    chunk_nbytes: int
    oneshot: bool = False
    area: int = 0


def split_bytes(nbytes: int, parts: int, itemsize: int) -> list[tuple[int, int]]:
    """Cut ``nbytes`` (whole elements of ``itemsize``) into ``parts`` contiguous ranges, each
    starting on a 64-byte line when the range is big enough; ranges may be empty.

    Raises:
        ValueError: ``parts`` < 1, or ``nbytes`` is not a whole number of elements.
    """
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    if nbytes % itemsize:
        raise ValueError(f"{nbytes} bytes is not a whole number of {itemsize}-byte elements")
    unit = itemsize * LINE // _gcd(itemsize, LINE)  # smallest whole-element multiple of a line
    units = nbytes // unit
    base, extra = divmod(units, parts)
    ranges, start = [], 0
    for i in range(parts):
        stop = start + (base + (1 if i < extra else 0)) * unit
        ranges.append((start, stop))
        start = stop
    last_start = ranges[-1][0]
    ranges[-1] = (last_start, nbytes)  # the tail that is smaller than a unit goes to the last
    return ranges


def chunk_ranges(nbytes: int, chunk_nbytes: int) -> tuple[tuple[int, int], ...]:
    """Consecutive ranges of at most ``chunk_nbytes``; at least one (maybe empty) range, so an
    empty collective still has a round in which ranks check each other."""
    if chunk_nbytes < 1:
        raise ValueError(f"chunk_nbytes must be at least 1, got {chunk_nbytes}")
    if nbytes == 0:
        return ((0, 0),)
    return tuple((a, min(a + chunk_nbytes, nbytes)) for a in range(0, nbytes, chunk_nbytes))


def _align_down(n: int, unit: int) -> int:
    return max(unit, n // unit * unit)


def _unit(itemsize: int, parts: int = 1) -> int:
    """The chunk granule: whole elements, and ``parts`` line-aligned slices when possible."""
    return parts * itemsize * LINE // _gcd(itemsize, LINE)


def takes_one_round(nbytes: int, size: int, oneshot_nbytes: int) -> bool:
    """Whether an all_reduce of ``nbytes`` per rank takes one round, every rank reducing every
    buffer: when what each rank reads from its peers, ``(size - 1) * nbytes``, is at most
    ``oneshot_nbytes``. (Staged, a rank copies about twice as much but reduces only its slice;
    one-shot costs one round instead of one per chunk plus one, and grows with the group.)
    With three ranks or more the bound is at most ONESHOT_MANY_RANKS: measured at worlds 3-4
    on 2 cores, staged won from there (world 4, 512 KB: 195 against 324 µs; world 3, 1 MB: 280
    against 401 µs), one-shot below it (world 3, 256 KB: 120 against 192 µs)."""
    reads = nbytes * max(size - 1, 1)
    return reads <= (oneshot_nbytes if size <= 2 else min(oneshot_nbytes, ONESHOT_MANY_RANKS))


def _rotates(nbytes: int, rotate: bool) -> bool:
    return rotate and ROTATE_MIN <= nbytes <= ROTATE_MAX


def wanted_half(op: str, nbytes: int, size: int, chunk_nbytes: int, oneshot_nbytes: int,
                rotate: bool = False) -> int:
    """Bytes each data slot should have for the fastest plan of ``op`` on ``nbytes``.

    ``nbytes`` is the per-rank message: the buffer for all_reduce/reduce/broadcast, the input
    for all_gather and reduce_scatter (``size`` pieces). A staged all_reduce needs room for a
    chunk and for its reduced slices (two chunks' worth); a one-shot one that rotates
    (``rotate``: the group's ranks have a CPU each, see ROTATE_HALF) asks for ROTATE_HALF.
    """
    if op == "all_reduce":
        if takes_one_round(nbytes, size, oneshot_nbytes):
            return max(nbytes, ROTATE_HALF) if _rotates(nbytes, rotate) else nbytes
        return 2 * min(nbytes, chunk_nbytes)
    if op in ("reduce_scatter", "scatter"):
        want = min(nbytes, max(chunk_nbytes, size * LINE))
    else:
        want = min(nbytes, chunk_nbytes)
    return max(want, ROTATE_HALF) if _rotates_chunks(op, nbytes, want < nbytes, rotate) else want


def _rotates_chunks(op: str, nbytes: int, several: bool, rotate: bool) -> bool:
    """Whether broadcast/all_gather/reduce_scatter write rotating areas: a message that takes
    one round rotates like a one-shot all_reduce; a reduce_scatter of several rounds rotates its
    chunks through the slot's areas too (an area is written again only after the peers' caches
    have moved on: 16 and 64 MB at world 2 took half the time). A several-round broadcast or
    all_gather did not gain (all_gather 4 MB: 495-769 µs against 272-338), so they do not."""
    if not rotate or nbytes < ROTATE_MIN:
        return False
    return op == "reduce_scatter" if several else nbytes <= ROTATE_MAX


def plan(op: str, nbytes: int, itemsize: int, size: int, half: int, chunk_nbytes: int,
         oneshot_nbytes: int, rotate: bool = False) -> Plan:
    """The plan of ``op`` on a per-rank message of ``nbytes`` with data slots of ``half`` bytes.

    all_reduce: one round when the message fits a slot and :func:`takes_one_round` says so;
    otherwise chunks of up to ``chunk_nbytes`` (a chunk and its reduced slices share a slot), each a
    multiple of ``size`` line-aligned slices. reduce_scatter: the chunks cut each of the
    ``size`` pieces, and a round holds one chunk of every piece. The others: chunks of the
    message, one per round.
    """
    if op == "all_reduce":
        if nbytes <= half and takes_one_round(nbytes, size, oneshot_nbytes):
            area = _round_up(nbytes, PAGE)
            rotating = _rotates(nbytes, rotate) and half >= 2 * area
            return Plan(((0, nbytes),), nbytes, oneshot=True, area=area if rotating else 0)
        chunk = _align_down(min(chunk_nbytes, half // 2), _unit(itemsize, size))
        return Plan(chunk_ranges(nbytes, chunk), chunk)
    if op in ("reduce_scatter", "scatter"):  # a round holds one chunk of every piece
        piece = nbytes // size
        chunk = _align_down(min(chunk_nbytes, half) // size, _unit(itemsize))
        chunks, footprint = chunk_ranges(piece, chunk), size * chunk
    else:
        chunk = _align_down(min(chunk_nbytes, half), _unit(itemsize))
        chunks, footprint = chunk_ranges(nbytes, chunk), chunk
    # one round, and rotating: write one of the slot's areas in turn, as a one-shot all_reduce
    area = _round_up(footprint, PAGE)
    rotating = _rotates_chunks(op, nbytes, len(chunks) > 1, rotate) and half >= 2 * area
    return Plan(chunks, chunk, area=area if rotating else 0)


def area_offset(plan: Plan, round_: int, half: int) -> int:
    """Offset within its slot of the area that round ``round_`` of ``plan`` writes: the slot's
    areas in turn (the slot of round t is written again at round t + 2, so t // 2 counts the
    calls that used it); every rank computes the same from the same round and slot size."""
    if not plan.area:
        return 0
    return (round_ >> 1) % (half // plan.area) * plan.area


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


__all__ = ["LINE", "Plan", "area_offset", "chunk_ranges", "plan", "split_bytes", "takes_one_round",
           "wanted_half"]

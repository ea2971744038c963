"""Pure chunk arithmetic: how a buffer of ``numel`` elements is cut for an algorithm.

Every rank calls these with the same arguments and gets the same cuts, which is what keeps
the ranks' frames matched: a send of chunk k on one rank meets the receive of chunk k on the
other. Ranges are half-open element ranges ``(start, stop)``; callers multiply by the item
size to slice bytes, so a chunk never splits an element.
"""

from __future__ import annotations


def split_even(numel: int, parts: int) -> list[tuple[int, int]]:
    """Cut ``numel`` elements into ``parts`` contiguous ranges whose sizes differ by at most
    one (the first ``numel % parts`` ranges get the extra element); ranges may be empty.

    Raises:
        ValueError: ``parts`` < 1 or ``numel`` < 0.
    """
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    if numel < 0:
        raise ValueError(f"numel must be non-negative, got {numel}")
    base, extra = divmod(numel, parts)
    ranges = []
    start = 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def segments(start: int, stop: int, max_numel: int) -> list[tuple[int, int]]:
    """Cut ``[start, stop)`` into pieces of at most ``max_numel`` elements, for pipelining.

    An empty range gives one empty piece, so that a frame is still exchanged (the receiver
    checks every frame's header: an empty piece still proves the peer runs the same op).

    Raises:
        ValueError: ``max_numel`` < 1 or ``stop`` < ``start``.
    """
    if max_numel < 1:
        raise ValueError(f"max_numel must be at least 1, got {max_numel}")
    if stop < start:
        raise ValueError(f"empty range [{start}, {stop})")
    if start == stop:
        return [(start, stop)]
    return [(a, min(a + max_numel, stop)) for a in range(start, stop, max_numel)]


def elements_per(nbytes: int, itemsize: int) -> int:
    """How many whole elements fit in ``nbytes`` (at least one)."""
    return max(1, nbytes // max(1, itemsize))


def pipeline_chunks(numel: int, parts: int, chunk_numel: int) -> list[tuple[int, int]]:
    """Cut ``numel`` into consecutive chunks of about ``parts * chunk_numel`` elements, each cut
    again into ``parts`` blocks by the ring: a ring runs once per chunk with bounded scratch.
    Returns the chunk ranges (at least one, possibly empty)."""
    step = max(1, parts * chunk_numel)
    if numel == 0:
        return [(0, 0)]
    return [(a, min(a + step, numel)) for a in range(0, numel, step)]


def power_of_two_below(n: int) -> int:
    """The largest power of two <= ``n`` (``n`` >= 1)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    return 1 << (n.bit_length() - 1)


__all__ = ["elements_per", "pipeline_chunks", "power_of_two_below", "segments", "split_even"]

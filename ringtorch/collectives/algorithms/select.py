"""Pure: which socket algorithm runs a collective, from (op, nbytes, world_size, same_host).

Latency wins for small messages (fewest rounds: one direct exchange, or log2(p) rounds of
recursive doubling); bandwidth wins for large ones (the ring sends 2(p-1)/p of the buffer per
rank instead of (p-1) times it, in bounded segments). The thresholds are in ``TABLE`` so a
benchmark can read what it measures, and an override string (``RINGTORCH_ALGORITHMS``, e.g.
``"all_reduce=ring,broadcast=chain,segment=4096"``) forces a choice (and the segment size in
bytes) for tests and measurements.

The answer carries the algorithm itself (``Choice.run``, from the ``ALGORITHMS`` table): the
caller runs it, it never maps a name back to a function. The functions of one op share one
signature (sockets/*.py), so any of them can be called the same way:

    all_reduce(link, buf, reducer, itemsize, segment_nbytes)
    broadcast(link, buf, root, segment_nbytes)
    reduce(link, buf, root, reducer, itemsize, segment_nbytes)
    all_gather(link, out, inp)              reduce_scatter(link, out, inp, reducer, itemsize,
    gather(link, out, inp, root)                           segment_nbytes)
    scatter(link, out, inp, root)           all_to_all(link, out, inp, out_offsets, in_offsets)
    barrier(link)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ringtorch.collectives.algorithms.sockets import direct, recursive_doubling, ring, tree

Algorithm = Callable[..., None]

ALGORITHMS: dict[str, dict[str, Algorithm]] = {
    "all_reduce": {"direct": direct.all_reduce, "recursive_doubling": recursive_doubling.all_reduce,
                   "ring": ring.all_reduce, "scatter_gather": direct.all_reduce_scatter_gather},
    "broadcast": {"tree": tree.broadcast_tree, "chain": tree.broadcast_chain},
    "reduce": {"direct": direct.reduce, "ring": ring.reduce},
    "all_gather": {"direct": direct.all_gather, "ring": ring.all_gather},
    "reduce_scatter": {"direct": direct.reduce_scatter, "ring": ring.reduce_scatter},
    "gather": {"direct": direct.gather},
    "scatter": {"direct": direct.scatter},
    "all_to_all": {"direct": direct.all_to_all},
    "barrier": {"dissemination": recursive_doubling.barrier},
}

# Algorithms in which only the root applies the reduction: the root's op is the one used and
# the other ranks' op is not compared (torch's gloo does the same; seed 003's reduce passes
# MAX on the root only). Everywhere else every rank reduces, so every rank must pass one op.
ROOT_ONLY_REDUCTION = frozenset({direct.reduce})


@dataclass(frozen=True)
class Choice:
    """An algorithm, its pipelining segment (bytes per frame for segmented algorithms) and
    the function that runs it (not compared: the name says which it is)."""

    algorithm: str
    segment_nbytes: int
    run: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Table:
    """Size thresholds in bytes of the caller's buffer (per rank)."""

    small_all_reduce: int = 256 * 1024
    small_broadcast: int = 256 * 1024
    small_all_gather: int = 256 * 1024
    small_reduce_scatter: int = 256 * 1024
    direct_max_world: int = 8
    segment_same_host: int = 1024 * 1024
    segment_remote: int = 512 * 1024


TABLE = Table()


def parse_overrides(text: str) -> dict[str, str]:
    """Parse ``"op=algorithm,op=algorithm"``.

    ``segment=<bytes>`` sets the pipelining segment size.

    Raises:
        ValueError: an unknown op or an algorithm that op does not have; the message lists
            the valid names.
    """
    overrides: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        op, sep, algorithm = item.partition("=")
        op, algorithm = op.strip(), algorithm.strip()
        if op == "segment" and sep:
            if not algorithm.isdigit() or int(algorithm) < 1:
                raise ValueError(f"bad algorithm override {item!r}: segment takes a positive "
                                 f"number of bytes")
            overrides[op] = algorithm
            continue
        if not sep or op not in ALGORITHMS:
            raise ValueError(f"bad algorithm override {item!r}: expected op=algorithm with op "
                             f"one of {sorted(ALGORITHMS)}")
        if algorithm not in ALGORITHMS[op]:
            raise ValueError(f"bad algorithm override {item!r}: {op} has algorithms "
                             f"{list(ALGORITHMS[op])}")
        overrides[op] = algorithm
    return overrides


def choose(op: str, nbytes: int, world_size: int, same_host: bool,
           overrides: dict[str, str] | None = None, table: Table = TABLE) -> Choice:
    """The algorithm for one collective; every rank computes the same answer from the same
    arguments (``nbytes`` is the per-rank buffer size, ``same_host`` whether all ranks share
    one host).

    Raises:
        ValueError: unknown op.
    """
    if op not in ALGORITHMS:
        raise ValueError(f"unknown collective {op!r}; known: {sorted(ALGORITHMS)}")
    segment = table.segment_same_host if same_host else table.segment_remote
    if overrides and "segment" in overrides:
        segment = int(overrides["segment"])
    name = overrides[op] if overrides and op in overrides else _default(op, nbytes, world_size,
                                                                          table)
    return Choice(name, segment, ALGORITHMS[op][name])


def _default(op: str, nbytes: int, world_size: int, table: Table) -> str:
    power_of_two = world_size & (world_size - 1) == 0
    if op == "all_reduce":
        if nbytes > table.small_all_reduce and world_size > 1:
            return "ring"
        if power_of_two or world_size > table.direct_max_world:
            return "recursive_doubling"
        return "direct"
    if op == "broadcast":
        return "tree" if nbytes <= table.small_broadcast or world_size <= 2 else "chain"
    if op == "reduce":
        # the ring also at world 2: direct would need a scratch copy of the whole buffer
        return "direct" if nbytes <= table.small_all_reduce or world_size == 1 else "ring"
    if op == "all_gather":
        return "direct" if nbytes <= table.small_all_gather or world_size <= 2 else "ring"
    if op == "reduce_scatter":
        return "direct" if nbytes <= table.small_reduce_scatter or world_size == 1 else "ring"
    return next(iter(ALGORITHMS[op]))


__all__ = ["ALGORITHMS", "ROOT_ONLY_REDUCTION", "TABLE", "Algorithm", "Choice", "Table",
           "choose", "parse_overrides"]

"""Which gradients share a bucket: a pure function of sizes, dtypes and caps (no torch here).

Rule kept (torch's ``compute_bucket_assignment_by_size``, walked in reverse parameter order):
parameters are visited from the last to the first, the order in which backward usually makes
their gradients; each (dtype, device) key fills its own open bucket, which closes as soon as its
size reaches the key's current cap. Each key's first bucket is capped at ``first_cap_bytes``
(1 MiB by default) so that the first all_reduce starts early; later ones at ``cap_bytes``.
Unlike torch, a parameter at least as large as the current cap, or at least ``solo_bytes``,
gets a bucket of its own (the open bucket of smaller ones before it is closed first): such a
gradient is then all_reduced in place, without being copied into a bucket and back. The
result is ordered by when each bucket is expected to be complete, which is the order every rank
launches the buckets' all_reduces in.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

MIB = 1024 * 1024
DEFAULT_FIRST_BUCKET_BYTES = MIB
DEFAULT_BUCKET_CAP_MB = 25


@dataclass(frozen=True)
class BucketPlan:
    """One bucket: the parameter indices in it and where each lives in its flat buffer."""

    indices: tuple[int, ...]
    offsets: tuple[int, ...]
    numel: int


def assign_buckets(nbytes: Sequence[int], keys: Sequence[Hashable], first_cap_bytes: int,
                   cap_bytes: int, solo_bytes: int | None = None) -> list[list[int]]:
    """Group parameter indices ``0..len(nbytes)-1`` into buckets.

    Args:
        nbytes: each parameter's gradient size in bytes, in parameter (definition) order.
        keys: each parameter's bucket key, e.g. ``(dtype, device)``; keys never mix.
        first_cap_bytes: the cap of each key's first bucket (0: one parameter per bucket).
        cap_bytes: the cap of every later bucket.
        solo_bytes: a parameter of at least this size gets a bucket of its own even below
            the current cap (None: only one that reaches the current cap).

    Returns:
        Buckets in launch order; each lists its indices in reverse parameter order.

    Raises:
        ValueError: the lengths differ or a cap is negative.
    """
    if len(nbytes) != len(keys):
        raise ValueError(f"got {len(nbytes)} sizes but {len(keys)} keys")
    if first_cap_bytes < 0 or cap_bytes < 0:
        raise ValueError(f"bucket caps must not be negative, got first={first_cap_bytes}, "
                         f"later={cap_bytes}")
    open_buckets: dict[Hashable, list[int]] = {}
    open_bytes: dict[Hashable, int] = {}
    closed_count: dict[Hashable, int] = {}
    result: list[list[int]] = []
    for index in reversed(range(len(nbytes))):
        key = keys[index]
        cap = first_cap_bytes if closed_count.get(key, 0) == 0 else cap_bytes
        alone = nbytes[index] >= cap > 0 or (solo_bytes is not None
                                             and nbytes[index] >= solo_bytes > 0)
        if alone and open_buckets.get(key):
            # a parameter that fills a bucket alone gets one: the smaller ones before it go
            # first, and its gradient can be reduced where it lies (reducer.py)
            result.append(open_buckets.pop(key))
            open_bytes[key] = 0
        open_buckets.setdefault(key, []).append(index)
        open_bytes[key] = open_bytes.get(key, 0) + nbytes[index]
        if open_bytes[key] >= cap or alone:
            result.append(open_buckets.pop(key))
            open_bytes[key] = 0
            closed_count[key] = closed_count.get(key, 0) + 1
    result.extend(bucket for bucket in open_buckets.values() if bucket)
    # a bucket is complete when its earliest parameter's gradient arrives: launch in that order
    result.sort(key=lambda bucket: -min(bucket))
    return result


def plan_buckets(numels: Sequence[int], element_sizes: Sequence[int], keys: Sequence[Hashable],
                 first_cap_bytes: int, cap_bytes: int,
                 solo_bytes: int | None = None) -> list[BucketPlan]:
    """:func:`assign_buckets`, plus each parameter's offset (in elements) in its bucket."""
    nbytes = [n * s for n, s in zip(numels, element_sizes, strict=True)]
    plans = []
    for indices in assign_buckets(nbytes, keys, first_cap_bytes, cap_bytes, solo_bytes):
        offsets, total = [], 0
        for index in indices:
            offsets.append(total)
            total += numels[index]
        plans.append(BucketPlan(tuple(indices), tuple(offsets), total))
    return plans


def bucket_caps(bucket_cap_mb: float | None) -> tuple[int, int]:
    """(first bucket cap, later cap) in bytes for DDP's ``bucket_cap_mb``, as torch reads it.

    ``None`` means torch's defaults: a 1 MiB first bucket, 25 MiB after it. An explicit value
    caps every bucket, the first one included; 0 puts each parameter in a bucket of its own.

    Raises:
        ValueError: ``bucket_cap_mb`` is negative.
    """
    if bucket_cap_mb is None:
        return DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_MB * MIB
    if bucket_cap_mb < 0:
        raise ValueError(f"bucket_cap_mb must not be negative, got {bucket_cap_mb}")
    cap = int(bucket_cap_mb * MIB)
    return cap, cap

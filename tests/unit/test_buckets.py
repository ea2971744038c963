"""Bucket assignment: reverse parameter order, small first bucket, caps, keys never mixed."""

from __future__ import annotations

import pytest

from ringtorch.nn.parallel.buckets import (
    DEFAULT_FIRST_BUCKET_BYTES,
    MIB,
    assign_buckets,
    bucket_caps,
    plan_buckets,
)

F32, F16 = ("float32", "cpu"), ("float16", "cpu")
KIB = 1024

# (sizes in bytes, keys, first cap, later cap) -> buckets in launch order
TABLE = [
    pytest.param([10, 10, 10], [F32] * 3, 100, 100, [[2, 1, 0]], id="all-fit-one-bucket"),
    pytest.param([10, 10, 10, 10], [F32] * 4, 20, 20, [[3, 2], [1, 0]], id="cap-reached-exactly"),
    pytest.param([10, 10, 10, 10, 10], [F32] * 5, 10, 30, [[4], [3, 2, 1], [0]],
                 id="small-first-bucket-then-larger"),
    pytest.param([15, 5, 5], [F32] * 3, 20, 20, [[2, 1, 0]], id="bucket-may-overshoot-by-one"),
    pytest.param([50, 5, 5], [F32] * 3, 20, 20, [[2, 1], [0]], id="big-first-param-alone"),
    pytest.param([5, 5, 50], [F32] * 3, 20, 20, [[2], [1, 0]], id="big-last-param-alone"),
    pytest.param([1, 30, 1, 30], [F32] * 4, 10, 40, [[3], [2, 1, 0]],
                 id="big-param-alone-only-when-it-reaches-the-current-cap"),
    pytest.param([4, 4, 4], [F32] * 3, 0, 0, [[2], [1], [0]], id="cap-zero-one-per-bucket"),
    pytest.param([8, 2, 8, 2], [F32, F16, F32, F16], 8, 8, [[2], [3, 1], [0]],
                 id="dtypes-never-share-a-bucket"),
    pytest.param([], [], 1, 1, [], id="no-parameters"),
]


@pytest.mark.parametrize("nbytes,keys,first,later,expected", TABLE)
def test_assignment_table(nbytes, keys, first, later, expected):
    assert assign_buckets(nbytes, keys, first, later) == expected


# (sizes, first cap, later cap, solo size) -> buckets: a parameter of at least the solo size
# gets a bucket of its own even below the cap (DDP passes a quarter of the cap)
SOLO_TABLE = [
    pytest.param([1, 30, 1, 30], 10, 40, 10, [[3], [2], [1], [0]], id="solo-below-the-cap"),
    pytest.param([4, 8, 4, 4], 100, 100, 8, [[3, 2], [1], [0]], id="smaller-ones-close-first"),
    pytest.param([4, 7, 4], 100, 100, 8, [[2, 1, 0]], id="below-the-solo-size-shares"),
    pytest.param([16 * MIB, 16 * KIB, 64 * MIB, 16 * KIB, 16 * MIB, 4 * KIB], MIB, 25 * MIB,
                 25 * MIB // 4, [[5], [4], [3], [2], [1], [0]],
                 id="the-benchmark-mlp-every-weight-alone"),
]


@pytest.mark.parametrize("nbytes,first,later,solo,expected", SOLO_TABLE)
def test_solo_size_gives_large_parameters_a_bucket_of_their_own(nbytes, first, later, solo,
                                                                  expected):
    assert assign_buckets(nbytes, [F32] * len(nbytes), first, later, solo) == expected


def test_every_parameter_lands_in_exactly_one_bucket():
    nbytes = [(i * 37) % 11 + 1 for i in range(40)]
    keys = [F32 if i % 3 else F16 for i in range(40)]
    buckets = assign_buckets(nbytes, keys, 7, 13)
    flat = sorted(i for b in buckets for i in b)
    assert flat == list(range(40))
    assert all(len({keys[i] for i in b}) == 1 for b in buckets)


def test_buckets_launch_in_the_order_they_complete_in_backward():
    buckets = assign_buckets([4] * 10, [F32] * 10, 4, 8)
    earliest = [min(b) for b in buckets]
    assert earliest == sorted(earliest, reverse=True)


def test_plan_gives_offsets_in_elements():
    plans = plan_buckets([3, 5, 2], [4, 4, 4], [F32] * 3, 1000, 1000)
    assert len(plans) == 1
    assert plans[0].indices == (2, 1, 0)
    assert plans[0].offsets == (0, 2, 7)
    assert plans[0].numel == 10


@pytest.mark.parametrize("cap_mb,expected", [
    (None, (DEFAULT_FIRST_BUCKET_BYTES, 25 * MIB)),
    (25, (25 * MIB, 25 * MIB)),
    (0.5, (MIB // 2, MIB // 2)),
    (0, (0, 0)),
])
def test_bucket_cap_mb_reads_as_torch_reads_it(cap_mb, expected):
    assert bucket_caps(cap_mb) == expected


def test_negative_cap_is_rejected():
    with pytest.raises(ValueError, match=r"^bucket_cap_mb must not be negative, got -1$"):
        bucket_caps(-1)


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match=r"^got 2 sizes but 1 keys$"):
        assign_buckets([1, 2], [F32], 1, 1)

"""Chunk arithmetic: every rank cuts a buffer the same way, no element is lost or split."""

from __future__ import annotations

import pytest

from ringtorch.collectives.algorithms.chunking import (
    elements_per,
    pipeline_chunks,
    power_of_two_below,
    segments,
    split_even,
)


@pytest.mark.parametrize(("numel", "parts", "expected"), [
    (10, 3, [(0, 4), (4, 7), (7, 10)]),
    (9, 3, [(0, 3), (3, 6), (6, 9)]),
    (2, 4, [(0, 1), (1, 2), (2, 2), (2, 2)]),
    (0, 2, [(0, 0), (0, 0)]),
    (5, 1, [(0, 5)]),
])
def test_split_even_gives_sizes_differing_by_at_most_one_extra_first(numel, parts, expected):
    assert split_even(numel, parts) == expected


def test_split_even_covers_every_element_once_for_many_shapes():
    for numel in range(0, 40):
        for parts in range(1, 9):
            ranges = split_even(numel, parts)
            assert len(ranges) == parts
            assert ranges[0][0] == 0 and ranges[-1][1] == numel
            assert all(a[1] == b[0] for a, b in zip(ranges[:-1], ranges[1:], strict=True))
            sizes = [b - a for a, b in ranges]
            assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(("numel", "parts"), [(5, 0), (-1, 2)])
def test_split_even_rejects_bad_arguments(numel, parts):
    with pytest.raises(ValueError, match=r"^(parts must be at least 1|numel must be non-negative)"):
        split_even(numel, parts)


def test_segments_cut_a_range_into_bounded_pieces_and_keep_one_empty_piece():
    assert segments(3, 10, 3) == [(3, 6), (6, 9), (9, 10)]
    assert segments(4, 4, 8) == [(4, 4)]
    with pytest.raises(ValueError, match=r"^max_numel must be at least 1, got 0$"):
        segments(0, 4, 0)
    with pytest.raises(ValueError, match=r"^empty range \[5, 4\)$"):
        segments(5, 4, 1)


def test_elements_per_rounds_down_to_whole_elements_but_never_to_zero():
    assert elements_per(1024, 4) == 256
    assert elements_per(1023, 4) == 255
    assert elements_per(3, 8) == 1


def test_pipeline_chunks_hold_parts_times_chunk_elements():
    assert pipeline_chunks(10, 2, 3) == [(0, 6), (6, 10)]
    assert pipeline_chunks(0, 4, 3) == [(0, 0)]
    assert pipeline_chunks(5, 4, 100) == [(0, 5)]


@pytest.mark.parametrize(("n", "expected"), [(1, 1), (2, 2), (3, 2), (7, 4), (8, 8), (9, 8)])
def test_power_of_two_below(n, expected):
    assert power_of_two_below(n) == expected

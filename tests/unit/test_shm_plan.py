"""Planning of the shared-memory collectives (algorithms/shm_plan.py): pure functions, so
every rank computes the same rounds, chunks fit their slots, and slices never split an
element or share a cache line."""

from __future__ import annotations

import pytest

from ringtorch.collectives.algorithms.shm.plan import (
    ROTATE_HALF,
    area_offset,
    chunk_ranges,
    plan,
    split_bytes,
    takes_one_round,
    wanted_half,
)

KIB, MIB = 1024, 1024 * 1024


@pytest.mark.parametrize(("nbytes", "parts", "itemsize", "want"), [
    (0, 3, 4, [(0, 0), (0, 0), (0, 0)]),
    (256, 2, 4, [(0, 128), (128, 256)]),
    (1200, 3, 4, [(0, 384), (384, 768), (768, 1200)]),  # the tail goes to the last slice
    (48, 3, 4, [(0, 0), (0, 0), (0, 48)]),  # smaller than a line each: the last takes all
    (960, 2, 12, [(0, 576), (576, 960)]),  # 12-byte elements: 192-byte granules, 3 + 2
    (10, 1, 2, [(0, 10)]),
])
def test_split_bytes_cuts_whole_lines_and_whole_elements(nbytes, parts, itemsize, want):
    assert split_bytes(nbytes, parts, itemsize) == want


def test_split_bytes_rejects_partial_elements_and_no_parts():
    with pytest.raises(ValueError, match=r"^10 bytes is not a whole number of 4-byte elements$"):
        split_bytes(10, 2, 4)
    with pytest.raises(ValueError, match=r"^parts must be at least 1, got 0$"):
        split_bytes(8, 0, 4)


def test_chunk_ranges_cover_the_message_and_an_empty_one_still_has_a_round():
    assert chunk_ranges(0, 100) == ((0, 0),)
    assert chunk_ranges(250, 100) == ((0, 100), (100, 200), (200, 250))
    with pytest.raises(ValueError, match=r"^chunk_nbytes must be at least 1, got 0$"):
        chunk_ranges(10, 0)


@pytest.mark.parametrize(("op", "nbytes", "size", "want"), [
    ("all_reduce", 1 * KIB, 2, 1 * KIB),  # one-shot: the message itself
    ("all_reduce", 256 * KIB, 2, 256 * KIB),
    ("all_reduce", 300 * KIB, 2, 600 * KIB),  # staged: a chunk and its reduced slices
    ("all_reduce", 64 * MIB, 4, 2 * MIB),
    ("reduce_scatter", 64 * MIB, 4, 1 * MIB),
    ("reduce_scatter", 100, 4, 100),
    ("all_gather", 64 * MIB, 3, 1 * MIB),
    ("broadcast", 10, 2, 10),
])
def test_wanted_half_is_what_the_fastest_plan_uses(op, nbytes, size, want):
    assert wanted_half(op, nbytes, size, chunk_nbytes=1 * MIB, oneshot_nbytes=256 * KIB) == want


def test_a_small_all_reduce_is_one_round():
    p = plan("all_reduce", 1 * KIB, 4, 2, 64 * KIB, 1 * MIB, 256 * KIB)
    assert (p.oneshot, p.chunks) == (True, ((0, 1 * KIB),))


def test_a_one_shot_all_reduce_that_does_not_fit_the_slot_is_staged():
    p = plan("all_reduce", 200 * KIB, 4, 2, 64 * KIB, 1 * MIB, 256 * KIB)
    assert not p.oneshot
    assert p.chunk_nbytes == 32 * KIB  # chunk + reduced slices fill the 64 KiB slot
    assert p.chunks[0] == (0, 32 * KIB) and p.chunks[-1][1] == 200 * KIB


@pytest.mark.parametrize(("nbytes", "size", "one_round"), [
    (1 * MIB, 2, True),  # a rank reads 1 MiB of its peer's
    (1 * MIB + 64, 2, False),
    (256 * KIB, 3, True),  # 2 peers x 256 KiB: from 3 ranks the cap is 512 KiB of reads
    (256 * KIB + 64, 3, False),
    (128 * KIB, 5, True),
    (129 * KIB, 5, False),
    (0, 4, True),
])
def test_one_round_while_what_a_rank_reads_from_its_peers_is_under_the_knob(nbytes, size,
                                                                            one_round):
    assert takes_one_round(nbytes, size, 1 * MIB) is one_round
    p = plan("all_reduce", nbytes, 4, size, 4 * MIB, 1 * MIB, 1 * MIB)
    assert p.oneshot is one_round
    half = wanted_half("all_reduce", nbytes, size, chunk_nbytes=1 * MIB, oneshot_nbytes=1 * MIB)
    assert half == (nbytes if one_round else 2 * min(nbytes, 1 * MIB))


@pytest.mark.parametrize(("nbytes", "rotate", "area"), [
    (64 * KIB, True, 64 * KIB),
    (100 * KIB + 4, True, 104 * KIB),  # whole pages
    (512 * KIB, True, 512 * KIB),
    (2 * MIB, True, 2 * MIB),  # two areas
    (8 * KIB, True, 0),  # small: its lines stay in the caches that use them
    (64 * KIB, False, 0),  # ranks that share CPUs share caches too
])
def test_one_shot_all_reduces_of_16k_to_2m_rotate_through_their_slot(nbytes, rotate, area):
    half = wanted_half("all_reduce", nbytes, 2, chunk_nbytes=1 * MIB, oneshot_nbytes=2 * MIB,
                       rotate=rotate)
    assert half == (ROTATE_HALF if area else nbytes)
    p = plan("all_reduce", nbytes, 4, 2, ROTATE_HALF, 1 * MIB, 2 * MIB, rotate)
    assert p.oneshot and p.area == area
    rounds = range(2, 2 * ROTATE_HALF // max(area, 1) + 4)
    offsets = [area_offset(p, t, ROTATE_HALF) for t in rounds]
    if not area:
        assert set(offsets) == {0}
        return
    assert all(o % 4096 == 0 and o + nbytes <= ROTATE_HALF for o in offsets)
    # rounds t and t + 1 use different slots; round t + 2 moves to the next area of the slot
    assert offsets[0] == offsets[1] and offsets[2] == (offsets[0] + area) % (ROTATE_HALF // area * area)
    assert len(set(offsets)) == ROTATE_HALF // area  # every area, in turn


def test_a_slot_too_small_for_two_areas_does_not_rotate():
    p = plan("all_reduce", 64 * KIB, 4, 2, 100 * KIB, 1 * MIB, 2 * MIB, True)
    assert p.oneshot and p.area == 0


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("itemsize", [1, 2, 4, 8, 16])
def test_staged_chunks_fit_their_slot_and_split_into_aligned_slices(size, itemsize):
    half = 64 * KIB
    nbytes = itemsize * 100_003
    p = plan("all_reduce", nbytes, itemsize, size, half, 1 * MIB, 0)
    assert 2 * p.chunk_nbytes <= half
    assert p.chunks[0][0] == 0 and p.chunks[-1][1] == nbytes
    assert all(b == c for (_, b), (c, _) in zip(p.chunks, p.chunks[1:], strict=False))
    for a, b in p.chunks[:-1]:
        for s0, s1 in split_bytes(b - a, size, itemsize):
            assert s0 % 64 == 0 and (s1 - s0) % itemsize == 0


def test_reduce_scatter_rounds_hold_one_chunk_of_every_piece():
    p = plan("reduce_scatter", 4 * 10 * MIB, 4, 4, 1 * MIB, 1 * MIB, 0)
    assert p.chunk_nbytes == 256 * KIB and 4 * p.chunk_nbytes <= 1 * MIB
    assert p.chunks[-1][1] == 10 * MIB  # chunks cut each rank's piece


def test_copies_move_one_chunk_per_round():
    p = plan("broadcast", 3 * MIB + 5, 1, 2, 2 * MIB, 1 * MIB, 0)
    assert p.chunks == ((0, MIB), (MIB, 2 * MIB), (2 * MIB, 3 * MIB), (3 * MIB, 3 * MIB + 5))


@pytest.mark.parametrize(("op", "nbytes", "rotates"), [
    ("broadcast", 64 * KIB, True), ("all_gather", 1 * MIB, True),
    ("reduce_scatter", 1 * MIB, True),  # one round each
    ("broadcast", 8 * KIB, False),  # below ROTATE_MIN
    ("all_gather", 4 * MIB, False), ("broadcast", 64 * MIB, False),  # several rounds
    ("reduce_scatter", 64 * MIB, True),  # several rounds, and still rotating
])
def test_copies_and_reduce_scatter_rotate_where_measured_faster(op, nbytes, rotates):
    assert wanted_half(op, nbytes, 2, 1 * MIB, 2 * MIB, rotate=True) == (
        max(min(nbytes, 1 * MIB), ROTATE_HALF) if rotates else min(nbytes, 1 * MIB))
    p = plan(op, nbytes, 4, 2, ROTATE_HALF, 1 * MIB, 2 * MIB, rotate=True)
    assert bool(p.area) is rotates
    assert (area_offset(p, 1, ROTATE_HALF), area_offset(p, 3, ROTATE_HALF)) == (
        (0, p.area) if rotates else (0, 0))  # consecutive uses of slot 1 write the next area
    unbound = plan(op, nbytes, 4, 2, ROTATE_HALF, 1 * MIB, 2 * MIB, rotate=False)
    assert unbound.area == 0  # ranks sharing CPUs never rotate

"""bench/collectives.py's PASS/FAIL lines for all_gather and reduce_scatter at world 2: at
least Open MPI's speed from 64 KB up, at least 5x gloo from 1 MB up, for each ringtorch
library of the run, checked on a hand-made table."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def collectives():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCH))
    try:
        import collectives as module
    finally:
        sys.path.remove(str(BENCH))
    return module


K, M = 1024, 1024 * 1024


def _run(collectives, times: dict[str, dict[int, float]]):  # type: ignore[no-untyped-def]
    args = collectives.parse_args(["--world-sizes", "2", "--ops", "all_gather",
                                   "--sizes", "1K,64K,1M", "--libs", ",".join(times)])
    results = {(lib, 2): [{f"all_gather/{n}": t for n, t in cells.items()}]
               for lib, cells in times.items()}
    return collectives.targets(results, args)


def test_every_size_from_64_kb_at_mpi_speed_and_5x_gloo_passes(collectives) -> None:  # type: ignore[no-untyped-def]
    lines = _run(collectives, {
        "shm": {K: 9e-6, 64 * K: 8e-6, M: 50e-6},       # 1 KB slower than MPI: not a target
        "gloo": {K: 300e-6, 64 * K: 350e-6, M: 250e-6},  # exactly 5x at 1 MB
        "mpi": {K: 3e-6, 64 * K: 8e-6, M: 57e-6}})
    assert lines == [
        "PASS  all_gather world 2 (shm), 64 KB and up: at least Open MPI's speed (slower at: none)",
        "PASS  all_gather world 2 (shm), 1 MB and up: at least 5x gloo (less at: none)"]


def test_a_size_slower_than_mpi_or_under_5x_gloo_fails_and_is_named(collectives) -> None:  # type: ignore[no-untyped-def]
    lines = _run(collectives, {
        "shm": {K: 9e-6, 64 * K: 15e-6, M: 51e-6},
        "ringtorch-dist": {K: 20e-6, 64 * K: 30e-6, M: 56e-6},
        "gloo": {K: 300e-6, 64 * K: 350e-6, M: 255e-6},
        "mpi": {K: 3e-6, 64 * K: 8e-6, M: 57e-6}})
    assert lines == [
        "FAIL  all_gather world 2 (shm), 64 KB and up: at least Open MPI's speed "
        "(slower at: ['64K'])",
        "PASS  all_gather world 2 (shm), 1 MB and up: at least 5x gloo (less at: none)",
        "FAIL  all_gather world 2 (ringtorch-dist), 64 KB and up: at least Open MPI's speed "
        "(slower at: ['64K'])",
        "FAIL  all_gather world 2 (ringtorch-dist), 1 MB and up: at least 5x gloo "
        "(less at: ['1M'])"]

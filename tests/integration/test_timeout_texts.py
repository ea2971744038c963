"""The texts of timeouts contain torch's phrases, which users and tools match, and keep
ringtorch's detail (who did not arrive, where each rank is).

Each case runs at world 2 under torch's gloo and under ringtorch, with rank 1 staying away;
the tests read torch's message from its own run and look for its phrases in ringtorch's.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

import pytest

from ringtorch.testing import run_ranks
from tests.integration import _timeout_texts_ranks as R


@functools.cache
def error(library: str, case: str) -> tuple[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        results = run_ranks(R.missing_rank, 2, timeout=90,
                            args=(library, case, str(Path(tmp) / "done")))
    assert results[0] is not None, f"{library} {case}: rank 0 raised nothing"
    return results[0]


@pytest.mark.parametrize("case", ["barrier", "all_reduce"])
def test_a_timed_out_collective_says_timed_out_as_torch_does_and_who_did_not_arrive(
        case: str) -> None:
    theirs = error("torch.distributed", case)[1]
    assert "Timed out waiting" in theirs, theirs  # torch's phrase, as measured
    kind, ours = error("ringtorch.distributed", case)
    assert kind in ("DistBackendError", "ShmPeerError"), (kind, ours)
    assert re.search(r"^" + case + r" #0 .*on group '0' .*timed out after 0:00:01 \(Timed out "
                     r"waiting \d+ms: the collective's timeout\): ranks \[1\] did not arrive "
                     r"\(rank 1 is at no collective yet\)", ours), ours
    assert "timeout" in ours


def test_a_monitored_barrier_names_the_missing_rank_and_the_timed_out_wait_as_torch_does(
        ) -> None:
    theirs = error("torch.distributed", "monitored")[1]
    head = "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms\n Original exception: \n"
    assert theirs.startswith(head) and "Timed out waiting" in theirs, theirs
    kind, ours = error("ringtorch.distributed", "monitored")
    assert kind == "DistBackendError"
    assert re.fullmatch(re.escape(head) + r"Timed out waiting \d+ms for rank 1 to reach "
                        r"monitoredBarrier: recv from rank 1 \(tag -1\) on group '0' timed "
                        r"out: no matching message arrived", ours), ours


def test_a_monitored_barrier_without_time_says_rank_0_timed_out_in_it_as_torch_does() -> None:
    theirs = error("torch.distributed", "monitored_no_time")[1]
    expected = ("[Rank 0]: Rank 1 failed to pass monitoredBarrier in 0 ms\n Original exception: "
                "\nRank 0 timed out in monitoredBarrier after 0 ms.\nNo ranks successfully "
                "processed in monitoredBarrier.")
    assert theirs.startswith(expected + "\n"), theirs  # torch adds its C++ stack after it
    assert error("ringtorch.distributed", "monitored_no_time") == ("DistBackendError", expected)

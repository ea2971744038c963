"""torch.profiler shows ringtorch's collectives and point-to-point operations as it shows torch's
gloo's: one event per operation, named "gloo:<op>" ("gloo:recvAnySource" for a receive from
any rank), with torch's input shapes under ``record_shapes=True`` (the inputs only: an
all_gather records its input tensor, not its outputs).

A world of 2 runs every operation under torch's gloo and one under ringtorch; the tests compare
the events each library records inside each operation's range, and a small table written out
here from torch's documented titles is the second check.
"""

from __future__ import annotations

import functools

import pytest

from ringtorch.testing import run_ranks
from tests.integration import _profiler_events_ranks as R

WS = 2


@functools.cache
def recorded(library: str) -> list[dict]:
    return run_ranks(R.events, WS, args=(library,), timeout=120)


@pytest.mark.parametrize("op", R.OPS)
@pytest.mark.parametrize("rank", range(WS))
def test_an_operation_is_recorded_with_torch_s_name_and_input_shapes(op: str,
                                                                     rank: int) -> None:
    theirs = recorded("torch.distributed")[rank][op]
    assert theirs, f"torch recorded no event for {op}"
    assert recorded("ringtorch.distributed")[rank][op] == theirs


@pytest.mark.parametrize(("op", "rank", "expected"), [
    ("all_gather", 0, [("gloo:all_gather", [[4]])]),
    ("all_gather_into_tensor", 1, [("gloo:all_gather", [[4]])]),
    ("scatter", 0, [("gloo:scatter", [[4], [4]])]),
    ("scatter", 1, [("gloo:scatter", [])]),
    ("all_to_all_single", 0, [("gloo:all_to_all", [[4]])]),
    ("recv_any_source", 0, [("gloo:recvAnySource", [[6]])]),
    ("recv_any_source", 1, [("gloo:send", [[6]])]),
])
def test_the_events_are_those_torch_documents(op: str, rank: int, expected: list) -> None:
    assert recorded("ringtorch.distributed")[rank][op] == expected

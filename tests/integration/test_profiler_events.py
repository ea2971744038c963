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
import tempfile

import pytest

from ringtorch.testing import run_ranks
from tests.integration import _profiler_events_ranks as R

WS = 2


@functools.cache
def recorded(library: str) -> list[dict]:
    return run_ranks(R.events, WS, args=(library, tempfile.mkdtemp()), timeout=120)


@pytest.mark.parametrize("op", R.OPS)
@pytest.mark.parametrize("rank", range(WS))
def test_an_operation_is_recorded_with_torch_s_name_and_input_shapes(op: str,
                                                                     rank: int) -> None:
    theirs = recorded("torch.distributed")[rank][op]
    assert theirs, f"torch recorded no event for {op}"
    assert recorded("ringtorch.distributed")[rank][op] == theirs


@pytest.mark.parametrize(("op", "rank", "expected"), [
    ("all_reduce", 0, [("gloo:all_reduce", [[4]], True)]),
    ("all_reduce_async", 1, [("gloo:all_reduce", [[4]], True)]),
    ("all_gather", 0, [("gloo:all_gather", [[4]], True)]),
    ("all_gather_into_tensor", 1, [("gloo:all_gather", [[4]], True)]),
    ("scatter", 0, [("gloo:scatter", [[4], [4]], True)]),
    ("scatter", 1, [("gloo:scatter", [], True)]),
    ("all_to_all_single", 0, [("gloo:all_to_all", [[4]], True)]),
    ("recv_any_source", 0, [("gloo:recvAnySource", [[6]], True)]),
    ("recv_any_source", 1, [("gloo:send", [[6]], True)]),
])
def test_the_events_are_those_torch_documents(op: str, rank: int, expected: list) -> None:
    assert recorded("ringtorch.distributed")[rank][op] == expected


@pytest.mark.parametrize("library", ["torch.distributed", "ringtorch.distributed"])
def test_an_asynchronous_operation_s_event_ends_when_it_completes(library: str) -> None:
    spans = recorded(library)[0]["timed"]
    (start, end), window, alone, late = (spans["gloo:all_reduce"], spans["timed:window"],
                                         spans["timed:alone"], spans["timed:late"])
    # issued inside the window, and not complete before rank 1 could join (after "alone")
    assert window[0] <= start < end and end >= alone[1]
    # ended by the completion, which rank 0 saw by the window's end, not by the wait after
    # "late": its duration is at most the wall time from issue to the wait
    assert end < late[1], (end, window, late)
    assert end - start <= late[1] - window[0]

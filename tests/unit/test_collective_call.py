"""A collective's identity (CollectiveCall), its encodings and the words that name it."""

from __future__ import annotations

import pytest
import torch

from ringtorch._wire.mesh import COLL_HEADER
from ringtorch.collectives.call import (
    COLL_TAG,
    DTYPE_CODES,
    NO_REDOP,
    NO_ROOT,
    OP_CODES,
    CallMaker,
    describe,
    frame_prefix,
    from_descriptor,
    from_frame,
)
from ringtorch.collectives.reduce_op import RedOpType
from ringtorch.collectives.reports import ShmWords, Words, missing_report


def _header(op: str, dtype: torch.dtype, seq: int, total: int, payload: int,
            redop: int = NO_REDOP, root: int = NO_ROOT) -> bytes:
    return COLL_HEADER.pack(COLL_TAG, OP_CODES[op], DTYPE_CODES[dtype], redop, root, seq, total,
                            payload)


def test_headers_are_described_with_op_seq_dtype_size_and_reduce_op_or_root():
    call, payload = from_frame(_header("all_reduce", torch.bfloat16, 7, 64, 32,
                                       redop=int(RedOpType.MAX)))
    assert (describe(call), payload) == ("all_reduce #7 (bfloat16, 64 bytes, op MAX)", 32)
    call, _ = from_frame(_header("broadcast", torch.float32, 3, 4096, 4096, root=2))
    assert describe(call) == "broadcast #3 (float32, 4096 bytes, root 2)"


@pytest.mark.parametrize(("op", "dtype", "redop", "root"), [
    ("all_reduce", torch.float16, RedOpType.AVG, -1),
    ("reduce", torch.int64, None, 3),
    ("broadcast", torch.complex64, None, 0),
    ("barrier", torch.uint8, None, -1),
])
def test_a_call_survives_both_encodings(op, dtype, redop, root):
    call = CallMaker("g")(op, 9, dtype, redop, root, 4096, 12.5)
    header = frame_prefix(call) + (100).to_bytes(8, "little")
    assert header == _header(op, dtype, 9, 4096, 100,
                             NO_REDOP if redop is None else int(redop),
                             NO_ROOT if root < 0 else root)
    decoded, payload = from_frame(header, "g")
    assert payload == 100
    again = from_descriptor(call.seq, call.kind, call.detail, call.nbytes, "g")
    for other in (decoded, again):
        assert (other.op, other.dtype, other.redop, other.root, other.seq, other.nbytes) == (
            op, dtype, redop, root, 9, 4096)
        assert describe(other) == describe(call)


def test_shared_buffers_and_reduce_without_its_op_are_named():
    make = CallMaker("g")
    call = make("all_reduce", 3, torch.float32, RedOpType.SUM, -1, 64, 0.0).on_shared(1)
    assert describe(call) == "all_reduce #3 (float32, 64 bytes, op SUM, shared tensor #1)"
    assert describe(make.shared_tensor(2, torch.float32, 64, 0.0)) == \
        "shared_tensor #2 (float32, 64 bytes)"
    red = make("reduce", 4, torch.float32, RedOpType.MAX, 1, 8, 0.0).without_redop()
    assert describe(red) == "reduce #4 (float32, 8 bytes, root 1)"


def test_frame_sizes_are_named_only_when_they_differ():
    words = Words("g", (0, 1))
    call = CallMaker("g")("all_to_all", 1, torch.int16, None, -1, 0, 0.0)
    a = _header("all_to_all", torch.int16, 1, 0, 10)
    assert words.mismatched_frame(call, 0, 1, a, a) == (
        "all_to_all #1 on group 'g': mismatched collectives: rank 0 runs all_to_all #1 "
        "(int16, 0 bytes) but rank 1 sent all_to_all #1 (int16, 0 bytes)")
    assert words.mismatched_frame(call, 0, 1, a, _header("all_to_all", torch.int16, 1, 0, 12)
                                  ).endswith("; this frame should carry 10 bytes, the peer's "
                                             "carries 12")


def test_shared_memory_words_match_the_socket_words():
    words = ShmWords("g")
    mine = CallMaker("g")("broadcast", 2, torch.float32, None, 0, 16, 0.0)
    theirs = from_descriptor(2, OP_CODES["all_reduce"], DTYPE_CODES[torch.float32] | 0 << 8,
                             16)
    assert words.mismatch(mine, 0, 1, theirs) == (
        "collective mismatch on group 'g': rank 0 called broadcast #2 (float32, 16 bytes, "
        "root 0) but rank 1 called all_reduce #2 (float32, 16 bytes, op SUM)")
    assert words.where(1, from_descriptor(-1, 0, 0, 0)) == "rank 1 is at no collective yet"
    assert words.timed_out(mine, 0, 61.2, [1], ["rank 1 is at no collective yet"]) == (
        "broadcast #2 (float32, 16 bytes, root 0) on group 'g' (rank 0) timed out after "
        "0:01:01 (Timed out waiting 61200ms: the collective's timeout): ranks [1] did not "
        "arrive (rank 1 is at no collective yet)")


def test_dtype_codes_are_unique_and_cover_every_dtype_the_tests_use():
    assert len(set(DTYPE_CODES.values())) == len(DTYPE_CODES)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.bool, torch.complex64,
                  torch.int8, torch.uint8, torch.int64, torch.uint64):
        assert dtype in DTYPE_CODES


def test_missing_report_names_late_silent_and_idle_ranks():
    who = lambda r: f"rank {r}"
    statuses = {1: {"op": "all_reduce", "seq": 5, "state": "running"},
                2: {"op": "broadcast", "seq": 4, "state": "finished"},
                4: {"op": None, "seq": -1, "state": "idle"}}
    assert missing_report(5, statuses, [1, 2, 3, 4], [1], who) == (
        "ranks [2, 3, 4] did not arrive (rank 2 is at broadcast #4 (finished); rank 3 did not "
        "answer; rank 4 is at no collective yet)")
    assert missing_report(5, {1: statuses[1]}, [1], [1], who) == (
        "every rank arrived; this rank was waiting for data from rank 1")


def test_the_mpi_agreement_record_round_trips_and_names_only_what_it_compares():
    from ringtorch.collectives.call import agreement_record, from_agreement
    from ringtorch.collectives.reports import disagreement

    make = CallMaker("default")
    mine = make("all_reduce", 3, torch.float32, RedOpType.SUM, -1, 12, 0.0)
    theirs = make("broadcast", 3, None, None, 0, 12, 0.0)
    calls = from_agreement(agreement_record(mine) + agreement_record(theirs), "default")
    assert [(c.op, c.seq, c.dtype, c.redop, c.root, c.nbytes) for c in calls] == [
        ("all_reduce", 3, torch.float32, RedOpType.SUM, -1, 12),
        ("broadcast", 3, None, None, 0, 12)]
    assert disagreement(mine, calls) == (
        "all_reduce #3 on group 'default': the ranks called different collectives or disagree "
        "on their arguments: rank 0 called all_reduce #3 (SUM, torch.float32, 12 bytes); "
        "rank 1 called broadcast #3 (12 bytes, root 0)")

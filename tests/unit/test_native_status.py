"""The words the native backend uses for frames and for ranks that did not arrive."""

from __future__ import annotations

import torch

from ringtorch._wire.mesh import COLL_HEADER, COLL_TAG, NO_REDOP, NO_ROOT
from ringtorch.collectives.backends.native_status import (
    DTYPE_CODES,
    OP_CODES,
    describe_header,
    frame_sizes,
    missing_report,
)
from ringtorch.collectives.reduce_op import RedOpType


def _header(op: str, dtype: torch.dtype, seq: int, total: int, payload: int,
            redop: int = NO_REDOP, root: int = NO_ROOT) -> bytes:
    return COLL_HEADER.pack(COLL_TAG, OP_CODES[op], DTYPE_CODES[dtype], redop, root, seq, total,
                            payload)


def test_headers_are_described_with_op_seq_dtype_size_and_reduce_op_or_root():
    assert describe_header(_header("all_reduce", torch.bfloat16, 7, 64, 32,
                                   redop=int(RedOpType.MAX))) == \
        "all_reduce #7 (bfloat16, 64 bytes, op MAX)"
    assert describe_header(_header("broadcast", torch.float32, 3, 4096, 4096, root=2)) == \
        "broadcast #3 (float32, 4096 bytes, root 2)"


def test_frame_sizes_are_named_only_when_they_differ():
    a = _header("all_to_all", torch.int16, 1, 0, 10)
    assert frame_sizes(a, a) == ""
    assert frame_sizes(a, _header("all_to_all", torch.int16, 1, 0, 12)) == \
        "; this frame should carry 10 bytes, the peer's carries 12"


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

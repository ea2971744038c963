"""The real communicator of backend "nccl" (ringtorch/_device/nccl_comm.py, ``RealComm``) calls
the binding with the right C arguments in the right places, checked without a GPU: the
binding's functions are replaced by recorders, so each call's positional arguments (in
``nccl.h``'s order, which tests/unit/test_nccl_lib.py checks the table against) can be read.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ringtorch._device import nccl_comm, nccl_lib

COMM, STREAM = 0x1234, 0x99


class _Stream:
    cuda_stream = STREAM


def _recording(answers: dict[str, list[int]] | None = None) -> tuple[nccl_lib.Nccl, list[Any]]:
    """A bound library whose C functions record their arguments and answer success (or the
    codes in ``answers``, one per call)."""
    lib = nccl_lib.Nccl.__new__(nccl_lib.Nccl)
    calls: list[Any] = []
    queued = {name: list(codes) for name, codes in (answers or {}).items()}

    def recorder(name: str) -> Any:
        def call(*args: Any) -> Any:
            calls.append((name, args))
            if name == "ncclGetErrorString":
                return b"some error"
            if name == "ncclGetLastError":
                return b""
            code = queued[name].pop(0) if queued.get(name) else 0
            if name == "ncclCommGetAsyncError":  # the answer goes out through the pointer
                args[1]._obj.value = code
                return 0
            return code
        return call

    lib._functions = {fn.name: (fn, recorder(fn.name)) for fn in nccl_lib.FUNCTIONS}
    return lib, calls


def test_each_operation_passes_its_buffers_count_type_and_peer_in_nccl_h_order() -> None:
    lib, calls = _recording()
    comm = nccl_comm.RealComm(lib, COMM, 0, 2)
    a, b = torch.zeros(8), torch.zeros(16)
    pa, pb = a.data_ptr(), b.data_ptr()
    f32, i32 = nccl_lib.DATATYPES["float32"], nccl_lib.DATATYPES["int32"]
    comm.all_reduce(a, a, nccl_lib.MAX, _Stream())
    comm.broadcast(a, b, 1, _Stream())
    comm.reduce(a, b, nccl_lib.SUM, 1, _Stream())
    comm.all_gather(a, b, _Stream())
    comm.reduce_scatter(b, a, nccl_lib.SUM, _Stream())  # count: the output's
    comm.send(torch.zeros(3, dtype=torch.int32), 1, _Stream())
    comm.recv(torch.zeros(3, dtype=torch.bool), 1, _Stream())  # bool as uint8
    comm.all_reduce(torch.zeros(4, dtype=torch.complex64), torch.zeros(4, dtype=torch.complex64),
                    nccl_lib.SUM, _Stream())  # complex as twice as many floats
    got = [(name, args[2:]) if name in ("ncclAllReduce",) else (name, args) for name, args in calls]
    assert got[:5] == [
        ("ncclAllReduce", (8, f32, nccl_lib.MAX, COMM, STREAM)),
        ("ncclBroadcast", (pa, pb, 8, f32, 1, COMM, STREAM)),
        ("ncclReduce", (pa, pb, 8, f32, nccl_lib.SUM, 1, COMM, STREAM)),
        ("ncclAllGather", (pa, pb, 8, f32, COMM, STREAM)),
        ("ncclReduceScatter", (pb, pa, 8, f32, nccl_lib.SUM, COMM, STREAM)),
    ]
    assert calls[0][1][:2] == (pa, pa)
    assert calls[5][0] == "ncclSend" and calls[5][1][1:] == (3, i32, 1, COMM, STREAM)
    assert calls[6][0] == "ncclRecv" and calls[6][1][1:] == (3, nccl_lib.DATATYPES["uint8"], 1,
                                                            COMM, STREAM)
    assert calls[7][0] == "ncclAllReduce" and calls[7][1][2:4] == (8, f32)


def test_a_call_in_progress_is_polled_to_its_end_and_a_failure_raises() -> None:
    lib, calls = _recording({"ncclAllReduce": [nccl_comm.IN_PROGRESS],
                             "ncclCommGetAsyncError": [nccl_comm.IN_PROGRESS, 0]})
    comm = nccl_comm.RealComm(lib, COMM, 0, 2)
    comm.all_reduce(torch.zeros(2), torch.zeros(2), nccl_lib.SUM, _Stream())
    assert [name for name, _ in calls] == ["ncclAllReduce", "ncclCommGetAsyncError",
                                           "ncclCommGetAsyncError"]
    lib, _ = _recording({"ncclBroadcast": [nccl_comm.REMOTE_ERROR]})
    comm = nccl_comm.RealComm(lib, COMM, 0, 2)
    with pytest.raises(nccl_lib.NcclError, match=r"^ncclBroadcast failed: some error "
                                                 r"\(ncclResult_t 6\)$"):
        comm.broadcast(torch.zeros(2), torch.zeros(2), 0, _Stream())


def test_a_dtype_nccl_lacks_is_refused_before_any_call() -> None:
    lib, calls = _recording()
    comm = nccl_comm.RealComm(lib, COMM, 0, 2)
    with pytest.raises(TypeError, match=r"^NCCL has no data type for torch.int16$"):
        comm.all_reduce(torch.zeros(2, dtype=torch.int16), torch.zeros(2, dtype=torch.int16),
                        nccl_lib.SUM, _Stream())
    assert calls == []

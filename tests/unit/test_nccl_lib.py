"""The NCCL binding (ringtorch/_device/nccl_lib.py): its table agrees with the wheel's
``nccl.h`` parameter by parameter (names and types), and the real library loads, reports its
version, makes unique ids and words its errors without a GPU. A communicator and an
all_reduce need a GPU (marked gpu(1)). Every test here needs the library (marked nccl_lib:
deselected where none is found)."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ringtorch import _config
from ringtorch._device import nccl_lib
from ringtorch.testing import wait_for

pytestmark = pytest.mark.nccl_lib

# C type in nccl.h -> the ctypes type a correct binding uses for it (written from the header's
# typedefs: the enums are int, handles and buffers pointers, ncclUniqueId a 128-byte struct).
C_TYPES = {
    "int": ctypes.c_int, "int*": ctypes.POINTER(ctypes.c_int), "size_t": ctypes.c_size_t,
    "void*": ctypes.c_void_p, "const void*": ctypes.c_void_p,
    "ncclResult_t": ctypes.c_int, "ncclResult_t*": ctypes.POINTER(ctypes.c_int),
    "ncclDataType_t": ctypes.c_int, "ncclRedOp_t": ctypes.c_int,
    "ncclComm_t": ctypes.c_void_p, "const ncclComm_t": ctypes.c_void_p,
    "ncclComm_t*": ctypes.POINTER(ctypes.c_void_p), "cudaStream_t": ctypes.c_void_p,
    "ncclUniqueId": nccl_lib.UniqueId, "ncclUniqueId*": ctypes.POINTER(nccl_lib.UniqueId),
    "const char*": ctypes.c_char_p, "ncclConfig_t*": ctypes.POINTER(nccl_lib.Config),
}


def _include_dir() -> Path:
    spec = importlib.util.find_spec("nvidia.nccl")
    assert spec is not None and spec.submodule_search_locations, "the nvidia-nccl wheel"
    return Path(list(spec.submodule_search_locations)[0]) / "include"


def _prototypes() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """name -> (return type, [(parameter name, C type)]) of every ``nccl*`` function."""
    text = re.sub(r"/\*.*?\*/", "", (_include_dir() / "nccl.h").read_text(), flags=re.S)
    found = {}
    for ret, name, params in re.findall(
            r"^\s*(ncclResult_t|const char\s*\*)\s*(nccl\w+)\s*\(([^)]*)\)\s*;", text, flags=re.M):
        parsed = []
        for param in (p.strip() for p in " ".join(params.split()).split(",")):
            if param in ("", "void"):
                continue
            m = re.fullmatch(r"(.*?[\s*])(\w+)", param)
            assert m, param
            parsed.append((m.group(2), re.sub(r"\s*\*", "*", m.group(1).strip())))
        found[name] = (re.sub(r"\s*\*", "*", ret.strip()), parsed)
    return found


def _mismatches(table: tuple[nccl_lib.Function, ...]) -> list[str]:
    header = _prototypes()
    problems = []
    for fn in table:
        if fn.name not in header:
            problems.append(f"{fn.name}: not in nccl.h")
            continue
        ret, params = header[fn.name]
        if C_TYPES[ret] is not fn.restype:
            problems.append(f"{fn.name}: returns {ret}, bound as {fn.restype}")
        expected = [(name, C_TYPES[ctype]) for name, ctype in params]
        if list(fn.params) != expected:
            problems.append(f"{fn.name}: nccl.h has {params}, bound as {list(fn.params)}")
    return problems


def test_every_bound_function_matches_ncclh_parameter_by_parameter() -> None:
    assert ctypes.sizeof(nccl_lib.UniqueId) == 128
    assert _mismatches(nccl_lib.FUNCTIONS) == []
    bound = {fn.name for fn in nccl_lib.FUNCTIONS}
    assert {"ncclCommInitRankConfig", "ncclBroadcast", "ncclReduce", "ncclAllGather",
            "ncclReduceScatter", "ncclSend", "ncclRecv"} <= bound


def test_the_config_struct_is_the_oldest_prefix_of_ncclh() -> None:
    text = re.sub(r"/\*.*?\*/", "", (_include_dir() / "nccl.h").read_text(), flags=re.S)
    body = re.search(r"typedef struct ncclConfig_v\d+ \{(.*?)\}", text, flags=re.S)
    assert body is not None
    header_fields = re.findall(r"(\w+)\s*;", body.group(1))
    declared = [name for name, _ in nccl_lib.Config._fields_]
    assert header_fields[:len(declared)] == declared
    magic = re.search(r"#define NCCL_API_MAGIC\s+(0x[0-9a-fA-F]+)", text)
    assert magic is not None and int(magic.group(1), 16) == nccl_lib.CONFIG_MAGIC
    config = nccl_lib.Config.nonblocking()
    assert (config.size, config.blocking, config.version) == (
        ctypes.sizeof(nccl_lib.Config), 0, 21400)


def test_the_header_check_catches_a_swap_of_same_typed_parameters() -> None:
    allreduce = next(fn for fn in nccl_lib.FUNCTIONS if fn.name == "ncclAllReduce")
    params = list(allreduce.params)
    params[3], params[4] = params[4], params[3]  # datatype <-> op: both int
    planted = nccl_lib.Function(allreduce.name, allreduce.restype, tuple(params))
    assert _mismatches((planted,)) == [
        f"ncclAllReduce: nccl.h has {_prototypes()['ncclAllReduce'][1]}, bound as {params}"]


def test_the_library_reports_its_version() -> None:
    lib = nccl_lib.load()
    header = (_include_dir() / "nccl.h").read_text()
    major, minor, patch = (int(re.search(rf"#define NCCL_{part}\s+(\d+)", header).group(1))  # type: ignore[union-attr]
                           for part in ("MAJOR", "MINOR", "PATCH"))
    if Path(lib.path).resolve().parent.parent == _include_dir().resolve().parent:
        assert nccl_lib.version_string(lib.version()) == f"{major}.{minor}.{patch}"
    else:  # another copy (torch's, or RINGTORCH_NCCL_LIBRARY): at least a 2.x version
        assert nccl_lib.version_string(lib.version()).startswith("2.")


def test_version_codes_decode_both_encodings() -> None:
    assert nccl_lib.version_string(23203) == "2.32.3"
    assert nccl_lib.version_string(22809) == "2.28.9"
    assert nccl_lib.version_string(2804) == "2.8.4"  # before 2.9: major*1000 + minor*100


def test_unique_ids_are_128_fresh_bytes() -> None:
    lib = nccl_lib.load()
    first, second = lib.unique_id(), lib.unique_id()
    assert len(first) == len(second) == 128
    assert first != second
    assert any(first)


def test_errors_are_worded_by_the_library() -> None:
    lib = nccl_lib.load()
    assert lib.error_string(0) == "no error"
    assert lib.error_string(4).startswith("invalid argument")  # 2.32 adds a hint
    lib.group_start()  # an empty group: no GPU needed
    lib.group_end()
    with pytest.raises(nccl_lib.NcclError,
                       match=r"^ncclCommGetAsyncError failed: invalid argument.*\(ncclResult_t 4\)"
                       ) as caught:
        lib.call("ncclCommGetAsyncError", comm=None, asyncError=None)
    assert caught.value.code == 4


def test_a_call_names_its_parameters() -> None:
    lib = nccl_lib.load()
    with pytest.raises(TypeError, match=r"^ncclGetVersion takes version; got versions$"):
        lib.raw("ncclGetVersion", versions=None)
    with pytest.raises(ValueError, match="an NCCL unique id has 128 bytes, got 3"):
        lib.comm_init_rank(1, b"abc", 0)


def test_the_configured_library_comes_first_and_must_exist(tmp_path: Path) -> None:
    wheel = nccl_lib._wheel_path()
    assert wheel is not None
    with _config.override(NCCL_LIBRARY=wheel):
        assert nccl_lib.locate() == (wheel, "RINGTORCH_NCCL_LIBRARY")
    missing = str(tmp_path / "libnccl.so.2")
    with _config.override(NCCL_LIBRARY=missing), pytest.raises(
            FileNotFoundError, match=f"^RINGTORCH_NCCL_LIBRARY='{re.escape(missing)}': no such file$"):
        nccl_lib.load()


LOOKUP = """
import ctypes, os, sys
from ringtorch._device import nccl_lib
print(nccl_lib.locate()[1])
ctypes.CDLL(sys.argv[1])
lib = nccl_lib.load()
print(lib.how, os.path.realpath(lib.path) == os.path.realpath(sys.argv[1]),
      lib._lib._handle == ctypes.CDLL(nccl_lib.SONAME)._handle)
"""


def test_a_library_already_loaded_is_bound_rather_than_a_second_copy() -> None:
    wheel = nccl_lib._wheel_path()
    assert wheel is not None
    env = {k: v for k, v in os.environ.items() if k != "RINGTORCH_NCCL_LIBRARY"}
    out = subprocess.run([sys.executable, "-c", LOOKUP, wheel], capture_output=True, text=True,
                         env=env, timeout=60, check=True).stdout.splitlines()
    how, same_path, same_handle = out[1].rsplit(maxsplit=2)
    assert (how, same_handle) == ("already loaded", "True")
    if out[0] == "nvidia.nccl wheel":  # nothing had loaded NCCL before the test's CDLL
        assert same_path == "True"
    else:  # torch's CUDA build had loaded its own: that one is bound
        assert out[0] == "already loaded"


def test_no_library_anywhere_is_an_error_saying_where_it_looked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl_lib, "locate", lambda: None)
    with pytest.raises(OSError, match="^no NCCL library found: RINGTORCH_NCCL_LIBRARY is unset"):
        nccl_lib.load()


@pytest.mark.gpu(1)
def test_a_one_rank_communicator_all_reduces_a_cuda_tensor() -> None:
    import torch

    lib = nccl_lib.load()
    comm = lib.comm_init_rank(1, lib.unique_id(), 0)
    try:
        data = torch.arange(1024, dtype=torch.float32, device="cuda")
        out = torch.empty_like(data)
        stream = torch.cuda.current_stream()
        lib.all_reduce(data.data_ptr(), out.data_ptr(), data.numel(),
                       nccl_lib.DATATYPES["float32"], nccl_lib.SUM, comm, stream.cuda_stream)
        stream.synchronize()
        assert torch.equal(out.cpu(), torch.arange(1024, dtype=torch.float32))
        assert lib.async_error(comm) == 0
    finally:
        lib.comm_destroy(comm)


@pytest.mark.gpu(1)
def test_a_nonblocking_init_waiting_for_a_missing_peer_stays_in_progress_until_aborted() -> None:
    import time

    from ringtorch._device import nccl_comm

    lib = nccl_comm.RealNccl()
    comm = lib.init_rank(2, lib.unique_id(), 0, 0)  # rank 1 never joins
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:  # a state that holds throughout, not one waited for
        assert comm.async_error() == nccl_comm.IN_PROGRESS
        time.sleep(0.05)
    started = time.monotonic()
    comm.abort()
    assert time.monotonic() - started < 30


@pytest.mark.gpu(1)
def test_a_nonblocking_one_rank_communicator_runs_each_collective_on_a_stream() -> None:

    import torch

    from ringtorch._device import nccl_comm

    lib = nccl_comm.RealNccl()
    comm = lib.init_rank(1, lib.unique_id(), 0, 0)
    wait_for(lambda: comm.async_error() != nccl_comm.IN_PROGRESS, 60,
             "the one-rank communicator's non-blocking init")
    assert comm.async_error() == nccl_comm.SUCCESS
    try:
        stream = torch.cuda.Stream()
        data = torch.arange(8, dtype=torch.float32, device="cuda")
        outs = [torch.full((8,), -1.0, device="cuda") for _ in range(5)]
        torch.cuda.current_stream().synchronize()  # data and outs are written before the ops
        comm.all_reduce(data, outs[0], nccl_comm.REDUCE_OPS["SUM"], stream)
        comm.broadcast(data, outs[1], 0, stream)
        comm.reduce(data, outs[2], nccl_comm.REDUCE_OPS["MAX"], 0, stream)
        comm.all_gather(data, outs[3], stream)
        comm.reduce_scatter(data, outs[4], nccl_comm.REDUCE_OPS["SUM"], stream)
        stream.synchronize()
        expected = torch.arange(8, dtype=torch.float32)
        for i, out in enumerate(outs):
            assert torch.equal(out.cpu(), expected), f"collective {i}"
        assert comm.async_error() == nccl_comm.SUCCESS
    finally:
        comm.destroy()

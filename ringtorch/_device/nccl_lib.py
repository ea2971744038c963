"""NCCL through ctypes: the library torch's CUDA build already ships, bound by one table.

``FUNCTIONS`` names each bound C function with its return type and its parameters *by name*
(the names of the wheel's ``nccl.h``; a CPU test compares both with the header), and
:meth:`Nccl.call` passes arguments by those names, so a swapped argument is caught by the
table check rather than by corrupted device memory. ``ncclUniqueId`` is a 128-byte structure
passed by value. Rules kept: never a second copy of the library beside torch's (the lookup
order below prefers the one already loaded), and nothing here needs a GPU except
communicators and collectives (the library loads, reports its version, makes unique ids and
words its errors on any Linux machine).

Lookup order: ``RINGTORCH_NCCL_LIBRARY``; the ``libnccl.so.2`` already loaded in this process
(torch's CUDA build loads it); the ``nvidia-nccl-cu*`` wheel's ``nvidia/nccl/lib``; plain
``libnccl.so.2`` on the loader's path.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from ringtorch import _config

SONAME = "libnccl.so.2"
UNIQUE_ID_BYTES = 128

# ncclResult_t, ncclDataType_t, ncclRedOp_t are C enums: int.
Result = ctypes.c_int


class UniqueId(ctypes.Structure):
    """``typedef struct { char internal[128]; } ncclUniqueId;`` (bytes, never a C string)."""

    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]


CommPtr = ctypes.c_void_p  # ncclComm_t: an opaque pointer
StreamPtr = ctypes.c_void_p  # cudaStream_t

CONFIG_MAGIC = 0xCAFEBEEF
CONFIG_UNDEF_INT = -(2**31)  # NCCL_CONFIG_UNDEF_INT (INT_MIN): "library default"
CONFIG_VERSION = 21400  # the oldest ncclConfig_t layout (2.14), declared below


class Config(ctypes.Structure):
    """``ncclConfig_t`` as NCCL 2.14 laid it out: the prefix every later version keeps.

    The struct is versioned (``size``, ``magic``, ``version`` first); NCCL reads only the
    fields of the version a caller declares, so declaring the oldest prefix with its size
    and version works on every library from 2.14 on. Only ``blocking`` is set (0: the init
    returns ncclInProgress at once, and a hung init can be aborted); the rest are left to
    the library (``CONFIG_UNDEF_INT``, NULL). A layout mistake cannot show without a GPU
    (ncclCommInitRankConfig checks CUDA first): the GPU check's NCCL tests cover it.
    """

    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int), ("cgaClusterSize", ctypes.c_int),
                ("minCTAs", ctypes.c_int), ("maxCTAs", ctypes.c_int),
                ("netName", ctypes.c_char_p)]

    @classmethod
    def nonblocking(cls) -> Config:
        return cls(ctypes.sizeof(cls), CONFIG_MAGIC, CONFIG_VERSION, 0, CONFIG_UNDEF_INT,
                   CONFIG_UNDEF_INT, CONFIG_UNDEF_INT, None)


@dataclass(frozen=True)
class Function:
    """One bound C function: its name, return type and (name, ctypes type) parameters."""

    name: str
    restype: Any
    params: tuple[tuple[str, Any], ...]


FUNCTIONS: tuple[Function, ...] = (
    Function("ncclGetVersion", Result, (("version", ctypes.POINTER(ctypes.c_int)),)),
    Function("ncclGetUniqueId", Result, (("uniqueId", ctypes.POINTER(UniqueId)),)),
    Function("ncclCommInitRank", Result, (
        ("comm", ctypes.POINTER(CommPtr)), ("nranks", ctypes.c_int), ("commId", UniqueId),
        ("rank", ctypes.c_int))),
    Function("ncclCommInitRankConfig", Result, (
        ("comm", ctypes.POINTER(CommPtr)), ("nranks", ctypes.c_int), ("commId", UniqueId),
        ("rank", ctypes.c_int), ("config", ctypes.POINTER(Config)))),
    Function("ncclCommDestroy", Result, (("comm", CommPtr),)),
    Function("ncclCommAbort", Result, (("comm", CommPtr),)),
    Function("ncclCommGetAsyncError", Result, (
        ("comm", CommPtr), ("asyncError", ctypes.POINTER(Result)))),
    Function("ncclGetErrorString", ctypes.c_char_p, (("result", Result),)),
    Function("ncclGetLastError", ctypes.c_char_p, (("comm", CommPtr),)),
    Function("ncclAllReduce", Result, (
        ("sendbuff", ctypes.c_void_p), ("recvbuff", ctypes.c_void_p), ("count", ctypes.c_size_t),
        ("datatype", ctypes.c_int), ("op", ctypes.c_int), ("comm", CommPtr),
        ("stream", StreamPtr))),
    Function("ncclBroadcast", Result, (
        ("sendbuff", ctypes.c_void_p), ("recvbuff", ctypes.c_void_p), ("count", ctypes.c_size_t),
        ("datatype", ctypes.c_int), ("root", ctypes.c_int), ("comm", CommPtr),
        ("stream", StreamPtr))),
    Function("ncclReduce", Result, (
        ("sendbuff", ctypes.c_void_p), ("recvbuff", ctypes.c_void_p), ("count", ctypes.c_size_t),
        ("datatype", ctypes.c_int), ("op", ctypes.c_int), ("root", ctypes.c_int),
        ("comm", CommPtr), ("stream", StreamPtr))),
    Function("ncclAllGather", Result, (
        ("sendbuff", ctypes.c_void_p), ("recvbuff", ctypes.c_void_p),
        ("sendcount", ctypes.c_size_t), ("datatype", ctypes.c_int), ("comm", CommPtr),
        ("stream", StreamPtr))),
    Function("ncclReduceScatter", Result, (
        ("sendbuff", ctypes.c_void_p), ("recvbuff", ctypes.c_void_p),
        ("recvcount", ctypes.c_size_t), ("datatype", ctypes.c_int), ("op", ctypes.c_int),
        ("comm", CommPtr), ("stream", StreamPtr))),
    Function("ncclSend", Result, (
        ("sendbuff", ctypes.c_void_p), ("count", ctypes.c_size_t), ("datatype", ctypes.c_int),
        ("peer", ctypes.c_int), ("comm", CommPtr), ("stream", StreamPtr))),
    Function("ncclRecv", Result, (
        ("recvbuff", ctypes.c_void_p), ("count", ctypes.c_size_t), ("datatype", ctypes.c_int),
        ("peer", ctypes.c_int), ("comm", CommPtr), ("stream", StreamPtr))),
    Function("ncclGroupStart", Result, ()),
    Function("ncclGroupEnd", Result, ()),
)

# ncclDataType_t by torch dtype name (nccl.h); ncclRedOp_t.
DATATYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
             "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4
IN_PROGRESS = 7  # ncclInProgress


class NcclError(RuntimeError):
    """A call returned an ncclResult_t other than ncclSuccess; ``code`` is that value."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _loaded_path() -> str | None:
    """The path of the libnccl.so.2 this process has mapped already, if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if os.path.basename(path) == SONAME:
                    return path
    except OSError:
        pass
    return None


def _wheel_path() -> str | None:
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = os.path.join(folder, "lib", SONAME)
        if os.path.exists(path):
            return path
    return None


def locate() -> tuple[str, str] | None:
    """``(what to load, how it was found)`` by the lookup order, without loading anything;
    None where no library can be found.

    Raises:
        FileNotFoundError: ``RINGTORCH_NCCL_LIBRARY`` names a file that does not exist.
    """
    configured = _config.NCCL_LIBRARY.get()
    if configured:
        if not os.path.exists(configured):
            raise FileNotFoundError(
                f"RINGTORCH_NCCL_LIBRARY={configured!r}: no such file")
        return configured, "RINGTORCH_NCCL_LIBRARY"
    loaded = _loaded_path()
    if loaded is not None:
        return loaded, "already loaded"
    wheel = _wheel_path()
    if wheel is not None:
        return wheel, "nvidia.nccl wheel"
    if ctypes.util.find_library("nccl") is not None:
        return SONAME, "loader path"
    return None


def version_string(code: int) -> str:
    """``ncclGetVersion``'s integer as major.minor.patch (2.9 changed the encoding)."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


class Nccl:
    """The bound library. Construct with :func:`load`."""

    def __init__(self, path: str, how: str) -> None:
        self.path = path
        self.how = how
        self._lib = ctypes.CDLL(path)
        self._functions: dict[str, tuple[Function, Any]] = {}
        for fn in FUNCTIONS:
            cfunc = getattr(self._lib, fn.name)  # AttributeError names a missing symbol
            cfunc.restype = fn.restype
            cfunc.argtypes = [ctype for _, ctype in fn.params]
            self._functions[fn.name] = (fn, cfunc)

    def raw(self, name: str, **arguments: Any) -> Any:
        """Call ``name`` with its parameters by name (all of them); returns what C returns."""
        fn, cfunc = self._functions[name]
        names = [param for param, _ in fn.params]
        if sorted(arguments) != sorted(names):
            raise TypeError(f"{name} takes {', '.join(names) or 'no arguments'}; "
                            f"got {', '.join(sorted(arguments)) or 'none'}")
        return cfunc(*(arguments[param] for param in names))

    def call(self, name: str, **arguments: Any) -> None:
        """:meth:`raw` for a function returning ncclResult_t; raises on anything but success.

        Raises:
            NcclError: the call failed; the message has NCCL's error string and, where the
                library has it, its last error text.
        """
        code = self.raw(name, **arguments)
        if code != 0:
            raise NcclError(f"{name} failed: {self.error_string(code)} (ncclResult_t {code})"
                            + self._last_error(arguments.get("comm")), code)

    def _last_error(self, comm: int | None) -> str:
        text = self.raw("ncclGetLastError", comm=comm)
        return f": {text.decode(errors='replace')}" if text else ""

    def error_string(self, code: int) -> str:
        text = self.raw("ncclGetErrorString", result=code)
        return text.decode(errors="replace") if text else f"unknown ncclResult_t {code}"

    def version(self) -> int:
        out = ctypes.c_int()
        self.call("ncclGetVersion", version=ctypes.byref(out))
        return out.value

    def unique_id(self) -> bytes:
        uid = UniqueId()
        self.call("ncclGetUniqueId", uniqueId=ctypes.byref(uid))
        return bytes(uid.internal)

    def comm_init_rank(self, nranks: int, unique_id: bytes, rank: int) -> int:
        """A communicator (blocking init: every rank must join)."""
        if len(unique_id) != UNIQUE_ID_BYTES:
            raise ValueError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
        uid = UniqueId()
        ctypes.memmove(uid.internal, unique_id, UNIQUE_ID_BYTES)
        comm = CommPtr()
        self.call("ncclCommInitRank", comm=ctypes.byref(comm), nranks=nranks, commId=uid,
                  rank=rank)
        return int(comm.value or 0)

    def comm_init_rank_nonblocking(self, nranks: int, unique_id: bytes, rank: int) -> int:
        """A communicator whose init goes on in the background (``blocking=0``): poll
        :meth:`async_error` until it is no longer ``IN_PROGRESS``; :meth:`comm_abort` stops
        a hung one."""
        if len(unique_id) != UNIQUE_ID_BYTES:
            raise ValueError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
        uid = UniqueId()
        ctypes.memmove(uid.internal, unique_id, UNIQUE_ID_BYTES)
        comm = CommPtr()
        config = Config.nonblocking()
        code = self.raw("ncclCommInitRankConfig", comm=ctypes.byref(comm), nranks=nranks,
                        commId=uid, rank=rank, config=ctypes.byref(config))
        if code not in (0, IN_PROGRESS):
            raise NcclError(f"ncclCommInitRankConfig failed: {self.error_string(code)} "
                            f"(ncclResult_t {code})" + self._last_error(None), code)
        return int(comm.value or 0)

    def comm_destroy(self, comm: int) -> None:
        self.call("ncclCommDestroy", comm=comm)

    def comm_abort(self, comm: int) -> None:
        self.call("ncclCommAbort", comm=comm)

    def async_error(self, comm: int) -> int:
        out = Result()
        self.call("ncclCommGetAsyncError", comm=comm, asyncError=ctypes.byref(out))
        return out.value

    def all_reduce(self, sendbuff: int, recvbuff: int, count: int, datatype: int, op: int,
                   comm: int, stream: int) -> None:
        self.call("ncclAllReduce", sendbuff=sendbuff, recvbuff=recvbuff, count=count,
                  datatype=datatype, op=op, comm=comm, stream=stream)

    def group_start(self) -> None:
        self.call("ncclGroupStart")

    def group_end(self) -> None:
        self.call("ncclGroupEnd")


def load() -> Nccl:
    """Bind the library found by the lookup order.

    Raises:
        OSError: no NCCL library could be found or loaded (the message says where it looked).
    """
    found = locate()
    if found is None:
        raise OSError(f"no NCCL library found: RINGTORCH_NCCL_LIBRARY is unset, no {SONAME} is "
                      "loaded, no nvidia-nccl wheel is installed and the loader's path has none")
    return Nccl(*found)

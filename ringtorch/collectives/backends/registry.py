"""Which backend moves a group's bytes: a registry keyed by name, with helpful errors.

``"gloo"`` is ringtorch's own native CPU backend (``backends/native.py``: shared memory on
one host, sockets across hosts, chosen per group by ``transports/``) under the name torch
scripts use: it plays gloo's role (CPU collectives over TCP, here also shared memory and Unix
sockets) but it is not the gloo library. ``"native"`` and ``"ringtorch"`` name the same
backend. ``"mpi"`` is the MPI backend (backends/mpi.py, over mpi4py); without mpi4py asking
for it raises an error that says what it needs, as ``"nccl"`` does until the device
feature ``nccl_backend`` is open (``ringtorch/_device/confirmed.py``); open, a "nccl" group
runs its CPU tensors on the native backend and its device tensors on NCCL (the facade's
``distributed/_nccl.py``). Users add their own with ``Backend.register_backend``, as in
torch; built-in backends are imported on first use so that importing ringtorch stays cheap.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ringtorch.collectives.backends.base import Backend as BackendImpl
from ringtorch.collectives.backends.base import BackendContext


@dataclass(frozen=True)
class _Entry:
    """How to make one backend: an import path, a user function, or why it is unavailable.

    ``missing`` is asked (cheaply, without importing the backend) what the backend lacks on
    this machine: None when it can be made, else the message that says what it needs.
    """

    import_path: str | None = None
    creator: Callable[..., Any] | None = None
    extended_api: bool = False
    unavailable: str | None = None
    missing: Callable[[], str | None] | None = None

    def why_unavailable(self) -> str | None:
        if self.unavailable is not None:
            return self.unavailable
        return self.missing() if self.missing is not None else None


def _mpi_missing() -> str | None:
    from ringtorch.collectives.backends import mpi_env

    if mpi_env.is_mpi_available():
        return None
    return ("the MPI backend needs mpi4py and an MPI library (pip install 'ringtorch[mpi]', "
            "or mpi4py built against your cluster's MPI) and a job started by an MPI launcher "
            "(mpirun/mpiexec/srun). Use backend='gloo' (ringtorch's native CPU backend) to "
            "run without MPI.")


_NCCL_CLOSED = (
    "the NCCL backend is not available in this version of ringtorch: it needs CUDA GPUs "
    "and the NCCL library, and stays off until it has been confirmed on a GPU. ringtorch runs "
    "collectives on CPU tensors: use backend='gloo' (ringtorch's native CPU backend).")


def _nccl_missing() -> str | None:
    # "nccl" is a device feature: closed (today's message) until a recorded GPU run opens it
    from ringtorch._device import nccl_comm

    if not nccl_comm.is_open():
        return _NCCL_CLOSED
    return nccl_comm.why_unusable()


_NATIVE = "ringtorch.collectives.backends.native:NativeBackend"

_ENTRIES: dict[str, _Entry] = {
    "gloo": _Entry(import_path=_NATIVE),
    "native": _Entry(import_path=_NATIVE),
    "ringtorch": _Entry(import_path=_NATIVE),
    "mpi": _Entry(import_path="ringtorch.collectives.backends.mpi:MpiBackend",
                  missing=_mpi_missing),
    # a group of backend "nccl" runs its CPU tensors (and barrier, object collectives) on
    # the native backend; its device tensors go to the facade's NCCL side
    "nccl": _Entry(import_path=_NATIVE, missing=_nccl_missing),
    "ucc": _Entry(unavailable="the UCC backend is not supported by ringtorch; use 'gloo'."),
    "xccl": _Entry(unavailable=("the XCCL backend (Intel GPUs) is not supported by ringtorch; "
                                "use 'gloo'.")),
}


def register(name: str, creator: Callable[..., Any], extended_api: bool = False) -> None:
    """Register a user backend: ``creator(store, group_rank, group_size, timeout)`` returns a
    ``ringtorch.collectives.backends.base.Backend``; with ``extended_api``,
    ``creator(ctx, pg_options)`` receives the whole ``BackendContext``.

    Raises:
        ValueError: ``name`` is a built-in backend's name.
    """
    key = name.lower()
    entry = _ENTRIES.get(key)
    if entry is not None and entry.creator is None:
        raise ValueError(f"backend name {name!r} is built in and cannot be re-registered")
    _ENTRIES[key] = _Entry(creator=creator, extended_api=extended_api)


def is_available(name: str) -> bool:
    """Whether ``create(name, ...)`` can make a backend (without importing it)."""
    entry = _ENTRIES.get(str(name).lower())
    return entry is not None and entry.why_unavailable() is None


def known_names() -> list[str]:
    """Every backend name the registry knows, available or not."""
    return sorted(_ENTRIES)


def require(name: str) -> None:
    """Check that ``create(name, ...)`` can work, before any rendezvous or connection.

    Raises:
        RuntimeError: the backend is unknown (the message lists the registered ones) or not
            available here (the message says what it needs).
    """
    _entry(name)


def _entry(name: str) -> _Entry:
    key = str(name).lower()
    entry = _ENTRIES.get(key)
    if entry is None:
        available = [n for n in sorted(_ENTRIES) if _ENTRIES[n].why_unavailable() is None]
        raise RuntimeError(
            f"Unknown c10d backend type {key.upper()}: no backend named {name!r} is registered "
            f"(available: {available}). Did you forget to call "
            f"Backend.register_backend({name!r}, ...)?")
    why = entry.why_unavailable()
    if why is not None:
        raise RuntimeError(f"Backend {key!r} is not available: {why}")
    return entry


def create(name: str, ctx: BackendContext, pg_options: Any = None) -> BackendImpl:
    """Make the backend ``name`` for one group.

    Raises:
        RuntimeError: as :func:`require`.
        TypeError: a user backend's function returned something that is not a Backend.
    """
    entry = _entry(name)
    if entry.creator is not None:
        if entry.extended_api:
            backend = entry.creator(ctx, pg_options)
        else:
            backend = entry.creator(ctx.store, ctx.rank, ctx.size, ctx.timeout)
    else:
        assert entry.import_path is not None
        module_name, _, attr = entry.import_path.partition(":")
        cls = getattr(importlib.import_module(module_name), attr)
        backend = cls(ctx)
    if not isinstance(backend, BackendImpl):
        raise TypeError(f"backend {name!r} returned {type(backend).__name__}, which is not a "
                        f"ringtorch.collectives.backends.base.Backend")
    return backend


def default_timeout(name: str) -> timedelta:
    """torch's default timeout for a backend: 30 minutes (NCCL's would be 10)."""
    return timedelta(minutes=10) if str(name).lower() == "nccl" else timedelta(minutes=30)


__all__ = ["create", "default_timeout", "is_available", "known_names", "register", "require"]

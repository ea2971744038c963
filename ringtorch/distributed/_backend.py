"""torch's ``Backend`` names and ``BackendConfig``, over ringtorch's backend registry.

``Backend("GLOO") == "gloo"``: backend names are lowercase strings. ``"gloo"`` selects
ringtorch's native CPU backend, which plays gloo's role (it is not the gloo library);
``"mpi"`` and ``"nccl"`` are known names whose use raises an error saying what they need
where they cannot run (``"nccl"`` until its device feature is open: docs/gpu.md).
``Backend.register_backend(name, func)`` adds a user backend: ``func(store, rank, size,
timeout)`` returns a ``ringtorch.collectives.backends.base.Backend``.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

from ringtorch.collectives.backends import registry


class Backend(str):
    """An enum-like class of backend names: ``Backend.GLOO == "gloo"``.

    ``Backend(name)`` returns the lowercase name (``Backend("GLOO")`` is ``"gloo"``).
    """

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    UCC = "ucc"
    MPI = "mpi"
    XCCL = "xccl"
    FAKE = "fake"

    backend_list = [UNDEFINED, GLOO, NCCL, XCCL, UCC, MPI, FAKE]
    default_device_backend_map: dict[str, str] = {"cpu": GLOO, "cuda": NCCL, "xpu": XCCL,
                                                  "mps": GLOO}
    backend_capability: dict[str, list[str]] = {
        GLOO: ["cpu", "cuda"], NCCL: ["cuda"], XCCL: ["xpu"], UCC: ["cpu", "cuda"],
        MPI: ["cpu", "cuda"], FAKE: ["cpu"],
    }

    def __new__(cls, name: str) -> str:  # type: ignore[misc]
        """Parse a backend name (any case) into its lowercase string."""
        if not isinstance(name, str):
            raise ValueError("Backend constructor parameter must be string-ish")
        value = getattr(Backend, name.upper(), Backend.UNDEFINED)
        if value == Backend.UNDEFINED:
            value = name.lower()
        return value

    @classmethod
    def register_backend(cls, name: str, func: Callable[..., Any], extended_api: bool = False,
                         devices: str | list[str] | None = None) -> None:
        """Register a backend under ``name`` for ``init_process_group(backend=name)``.

        Args:
            name: the backend's name (case-insensitive).
            func: ``func(store, group_rank, group_size, timeout)`` returning a
                ``ringtorch.collectives.backends.base.Backend``; with ``extended_api``,
                ``func(ctx, pg_options)`` receiving the ``BackendContext``.
            extended_api: see ``func``.
            devices: device types the backend supports (default: CPU, with a warning).
        """
        registry.register(name, func, extended_api)
        if not hasattr(Backend, name.upper()):
            setattr(Backend, name.upper(), name.lower())
        if name.lower() not in Backend.backend_list:
            Backend.backend_list.append(name.lower())
        if devices is None:
            warnings.warn(f"Device capability of {name} unspecified, assuming `cpu`. Please "
                          f"specify it via the `devices` argument of `register_backend`.",
                          stacklevel=2)
            devices = ["cpu"]
        Backend.backend_capability[name.lower()] = (
            [devices] if isinstance(devices, str) else list(devices))


class BackendConfig:
    """The device -> backend map of a group (``"cpu:gloo,cuda:nccl"``)."""

    def __init__(self, backend: str) -> None:
        backend = str(backend)
        self.device_backend_map: dict[str, str] = {}
        if backend == Backend.UNDEFINED:
            self.device_backend_map["cpu"] = Backend.GLOO
            if registry.is_available(Backend.NCCL):  # torch: the accelerator's backend too
                self.device_backend_map["cuda"] = Backend.NCCL
        elif ":" in backend:
            for pair in backend.lower().split(","):
                parts = pair.split(":")
                if len(parts) != 2:
                    raise ValueError(f"Invalid device:backend pairing: {pair}. The backend "
                                     f"string must look like 'cpu:gloo,cuda:nccl'")
                device, name = parts
                if device in self.device_backend_map:
                    raise ValueError(f"Duplicate device type {device} in backend string: "
                                     f"{backend}")
                self.device_backend_map[device] = Backend(name)
        else:
            name = Backend(backend)
            devices = Backend.backend_capability.get(name, ["cpu"])
            self.device_backend_map = dict.fromkeys(devices, name)

    def __repr__(self) -> str:
        return ",".join(f"{d}:{b}" for d, b in self.device_backend_map.items())

    def get_device_backend_map(self) -> dict[str, str]:
        """The device -> backend name map."""
        return self.device_backend_map

    def cpu_backend(self) -> str:
        """The backend that runs CPU tensors (what ringtorch creates for the group).

        Raises:
            RuntimeError: no backend is configured for CPU tensors.
        """
        name = self.device_backend_map.get("cpu")
        if name is None:
            for other in self.device_backend_map.values():
                registry.require(other)  # a GPU-only backend says what it needs
            if Backend.NCCL in self.device_backend_map.values():
                return Backend.NCCL  # its CPU side: ringtorch's native backend (registry)
            raise RuntimeError(f"backend config {self!r} has no backend for CPU tensors, and "
                               f"ringtorch runs collectives on CPU tensors")
        return name


def get_default_backend_for_device(device: Any) -> str:
    """The backend torch would pick for a device type ("cpu" -> "gloo")."""
    kind = device.type if hasattr(device, "type") else str(device).split(":")[0]
    backend = Backend.default_device_backend_map.get(kind)
    if backend is None:
        raise ValueError(f"Default backend not registered for device : {device}")
    return backend


def is_mpi_available() -> bool:
    """Whether the MPI backend can be asked for (mpi4py is installed)."""
    return registry.is_available("mpi")


def is_nccl_available() -> bool:
    """Whether the NCCL backend is available: False until a recorded GPU run confirms it
    (docs/gpu.md), and where torch sees no GPU or no NCCL library is found."""
    return registry.is_available("nccl")


def is_gloo_available() -> bool:
    """Whether the "gloo" backend is available: always (it is ringtorch's native backend)."""
    return registry.is_available("gloo")


def is_ucc_available() -> bool:
    """Whether the UCC backend is available (never in ringtorch)."""
    return registry.is_available("ucc")


def is_xccl_available() -> bool:
    """Whether the XCCL backend is available (never in ringtorch)."""
    return registry.is_available("xccl")


def is_backend_available(backend: str) -> bool:
    """Whether ``backend`` (a name, or a "device:backend,..." string) can be used."""
    if ":" in backend:
        names = BackendConfig(Backend(backend)).get_device_backend_map().values()
        return all(registry.is_available(n) for n in names)
    return registry.is_available(backend)


def is_torchelastic_launched() -> bool:
    """Whether this process was started by torchelastic/ringrun (``TORCHELASTIC_RUN_ID``)."""
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


__all__ = [
    "Backend",
    "BackendConfig",
    "get_default_backend_for_device",
    "is_backend_available",
    "is_gloo_available",
    "is_mpi_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "is_ucc_available",
    "is_xccl_available",
]

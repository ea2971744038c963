"""RPC backend options and constants, under torch's names and with torch's defaults.

Seed code writes ``rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=20)`` and
``backend=rpc.BackendType.TENSORPIPE``: both work and select ringtorch's agent. Device maps are
CUDA-only in torch; in ringtorch they are the feature ``gpu_training`` (``_devices.py``): while
it is closed, a non-empty device map or device list is rejected by ``init_rpc`` (the setters
still validate like torch's).
"""

from __future__ import annotations

import enum
from typing import Any

DEFAULT_RPC_TIMEOUT_SEC: float = 60.0
DEFAULT_INIT_METHOD: str = "env://"
DEFAULT_NUM_WORKER_THREADS: int = 16
DEFAULT_SHUTDOWN_TIMEOUT: float = 0
# A timeout argument left at this value means "use the agent's default".
UNSET_RPC_TIMEOUT: float = -1.0


class BackendType(enum.Enum):
    """The RPC backends; TENSORPIPE (torch's name) selects ringtorch's socket agent."""

    TENSORPIPE = "TENSORPIPE"

    def __repr__(self) -> str:
        return "BackendType." + self.name


class RpcBackendOptions:
    """Options every RPC agent takes: the default call timeout and the rendezvous URL."""

    def __init__(self, rpc_timeout: float = DEFAULT_RPC_TIMEOUT_SEC,
                 init_method: str = DEFAULT_INIT_METHOD) -> None:
        if not isinstance(rpc_timeout, (int, float)) or rpc_timeout < 0:
            raise ValueError(f"rpc_timeout must be a number of seconds >= 0, got {rpc_timeout!r}")
        if not isinstance(init_method, str):
            raise TypeError(f"init_method must be a URL string, got {type(init_method)}")
        self.rpc_timeout = float(rpc_timeout)
        self.init_method = init_method

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


def _device_map(device_map: dict[Any, Any]) -> dict[Any, Any]:
    import torch

    full: dict[Any, Any] = {}
    reverse: dict[Any, Any] = {}
    for key, value in device_map.items():
        key, value = torch.device(key), torch.device(value)
        if value in reverse:
            raise ValueError("`device_map` only supports 1-to-1 mapping, "
                             f"trying to map {key} and {reverse[value]} to {value}")
        full[key] = value
        reverse[value] = key
    return full


class TensorPipeRpcBackendOptions(RpcBackendOptions):
    """torch's TensorPipe options, for ringtorch's agent.

    Args:
        num_worker_threads: how many incoming calls may execute at once (default 16).
        rpc_timeout: default timeout of a call, in seconds (default 60; 0 means none).
        init_method: rendezvous URL, as for ``init_process_group`` (default ``env://``).
        device_maps, devices: where each device tensor sent to a worker goes (see
            ``_devices.py``); refused by ``init_rpc`` while the feature is closed.
        _transports, _channels: TensorPipe internals, ignored.
    """

    def __init__(self, *, num_worker_threads: int = DEFAULT_NUM_WORKER_THREADS,
                 rpc_timeout: float = DEFAULT_RPC_TIMEOUT_SEC,
                 init_method: str = DEFAULT_INIT_METHOD,
                 device_maps: dict[str, dict[Any, Any]] | None = None,
                 devices: list[Any] | None = None,
                 _transports: list[Any] | None = None,
                 _channels: list[Any] | None = None) -> None:
        super().__init__(rpc_timeout, init_method)
        if not isinstance(num_worker_threads, int) or num_worker_threads < 1:
            raise ValueError(f"num_worker_threads must be a positive integer, got "
                             f"{num_worker_threads!r}")
        self.num_worker_threads = num_worker_threads
        self.device_maps = {k: _device_map(v) for k, v in (device_maps or {}).items()}
        self.devices = list(devices or [])

    def set_device_map(self, to: str, device_map: dict[Any, Any]) -> None:
        """Record a device map for callee ``to`` (validated as torch does; see module doc)."""
        full = _device_map(device_map)
        current = self.device_maps.get(to, {})
        for key, value in full.items():
            if key in current and current[key] != value:
                raise ValueError("`set_device_map` only supports 1-to-1 mapping, trying"
                                 f" to map {key} to {value} and {current[key]}")
        self.device_maps[to] = {**current, **full}

    def set_devices(self, devices: list[Any]) -> None:
        """Record the local devices (see module doc)."""
        self.devices = list(devices)


def backend_registered(backend_name: str) -> bool:
    """Whether ``backend_name`` names an RPC backend (torch's backend_registry function)."""
    return backend_name in BackendType.__members__


def construct_rpc_backend_options(backend: BackendType, **kwargs: Any) -> RpcBackendOptions:
    """The default options of ``backend`` (torch's backend_registry function of that name)."""
    if backend is not BackendType.TENSORPIPE:
        raise ValueError(f"unknown RPC backend {backend!r}")
    return TensorPipeRpcBackendOptions(**kwargs)


__all__ = [
    "DEFAULT_INIT_METHOD",
    "DEFAULT_NUM_WORKER_THREADS",
    "DEFAULT_RPC_TIMEOUT_SEC",
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "UNSET_RPC_TIMEOUT",
    "BackendType",
    "RpcBackendOptions",
    "TensorPipeRpcBackendOptions",
    "backend_registered",
    "construct_rpc_backend_options",
]

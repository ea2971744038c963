"""ringtorch.distributed.rpc: torch.distributed.rpc's API on ringtorch's socket agent.

``import ringtorch.distributed.rpc as rpc`` where a script had ``torch.distributed.rpc``:
``init_rpc``, ``rpc_sync``, ``rpc_async``, ``remote``, ``RRef``, ``shutdown``,
``get_worker_info``, ``functions.async_execution`` and ``TensorPipeRpcBackendOptions``
behave as torch's. What differs is documented in docs/design/rref-protocol.md: calls to a
worker that died fail within milliseconds, connections are authenticated before anything is
unpickled, and same-host workers talk over Unix sockets. Packages above RPC (distributed
autograd) plug in through ``ringtorch.distributed.rpc.extensions`` and are loaded on first use.
"""

from __future__ import annotations

from ringtorch.distributed.rpc import constants, functions
from ringtorch.distributed.rpc._workerinfo import WorkerInfo
from ringtorch.distributed.rpc.api import (
    _set_rpc_timeout,
    _wait_all,
    get_rpc_timeout,
    get_worker_info,
    init_rpc,
    is_available,
    remote,
    rpc_async,
    rpc_sync,
    shutdown,
)
from ringtorch.distributed.rpc.errors import (
    RpcError,
    RpcPeerDiedError,
    RpcPeerUnreachableError,
    RpcProtocolError,
    RpcTimeoutError,
)
from ringtorch.distributed.rpc.options import (
    DEFAULT_INIT_METHOD,
    DEFAULT_NUM_WORKER_THREADS,
    DEFAULT_RPC_TIMEOUT_SEC,
    DEFAULT_SHUTDOWN_TIMEOUT,
    UNSET_RPC_TIMEOUT,
    BackendType,
    RpcBackendOptions,
    TensorPipeRpcBackendOptions,
    backend_registered,
    construct_rpc_backend_options,
)
from ringtorch.distributed.rpc.rref import RRef

PyRRef = RRef  # torch's name for the implementation class

__all__ = [
    "DEFAULT_INIT_METHOD",
    "DEFAULT_NUM_WORKER_THREADS",
    "DEFAULT_RPC_TIMEOUT_SEC",
    "DEFAULT_SHUTDOWN_TIMEOUT",
    "UNSET_RPC_TIMEOUT",
    "BackendType",
    "PyRRef",
    "RRef",
    "RpcBackendOptions",
    "RpcError",
    "RpcPeerDiedError",
    "RpcPeerUnreachableError",
    "RpcProtocolError",
    "RpcTimeoutError",
    "TensorPipeRpcBackendOptions",
    "WorkerInfo",
    "_set_rpc_timeout",
    "_wait_all",
    "backend_registered",
    "constants",
    "construct_rpc_backend_options",
    "functions",
    "get_rpc_timeout",
    "get_worker_info",
    "init_rpc",
    "is_available",
    "remote",
    "rpc_async",
    "rpc_sync",
    "shutdown",
]

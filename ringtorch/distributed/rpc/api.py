"""The public RPC functions, with torch's names, arguments, defaults and errors.

``init_rpc`` rendezvous through ``options.init_method`` (a ``PrefixStore`` named
``rpc_prefix_{n}`` as in torch), then starts this process's agent (agent.py), which connects
to every other worker. ``rpc_sync``/``rpc_async``/``remote`` pickle ``(func, args, kwargs)``
(functions travel by name, as in torch) and send them; a timeout of -1 means the agent's
default, 0 means none. ``shutdown(graceful=True)`` waits for the global agreement of
_shutdown.py before closing.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from ringtorch.distributed.rpc import _shutdown, messages
from ringtorch.distributed.rpc._handlers import create_remote
from ringtorch.distributed.rpc._rref_context import RRefContext, resolve_timeout
from ringtorch.distributed.rpc._workerinfo import WorkerInfo, describe
from ringtorch.distributed.rpc.agent import RpcAgent, current_agent, set_current_agent
from ringtorch.distributed.rpc.options import (
    DEFAULT_SHUTDOWN_TIMEOUT,
    UNSET_RPC_TIMEOUT,
    BackendType,
    RpcBackendOptions,
    TensorPipeRpcBackendOptions,
    construct_rpc_backend_options,
)
from ringtorch.distributed.rpc.rref import RRef, _invoke_on_owner
from ringtorch.futures import Future

_NAME = re.compile(r"^[A-Za-z0-9_:\-]{1,127}$")
_init_counter = itertools.count()
_init_lock = threading.Lock()
_thread_local = threading.local()
_rendezvous_keepalive: list[Any] = []


def _store_functions() -> tuple[Any, Any]:
    """(rendezvous, PrefixStore): ringtorch's when both exist, else torch's."""
    try:
        from ringtorch.rendezvous import rendezvous  # type: ignore[import-not-found]
        from ringtorch.store import PrefixStore  # type: ignore[attr-defined]
    except ImportError:  # TODO(issue 1): ringtorch.rendezvous and ringtorch.store not landed
        from torch.distributed import PrefixStore, rendezvous
    return rendezvous, PrefixStore


def _rendezvous(init_method: str, rank: int, world_size: int) -> tuple[Any, int, int, Any]:
    rendezvous, prefix_store = _store_functions()
    iterator = rendezvous(init_method, rank=rank, world_size=world_size)
    _rendezvous_keepalive.append(iterator)
    store, rank, world_size = next(iterator)
    return store, rank, world_size, prefix_store


def init_rpc(name: str, backend: BackendType | None = None, rank: int = -1,
             world_size: int | None = None,
             rpc_backend_options: RpcBackendOptions | None = None) -> None:
    """Start this process's RPC agent and connect it to every other worker.

    Raises:
        TypeError: ``backend`` or ``rpc_backend_options`` of the wrong type (torch's messages).
        ValueError: a bad name, ``world_size`` missing (dynamic groups are not supported),
            or device maps (CPU only).
        RuntimeError: RPC is already initialized; duplicate worker names.
    """
    if backend is not None and not isinstance(backend, BackendType):
        raise TypeError("Argument backend must be a member of BackendType")
    if rpc_backend_options is not None and not isinstance(rpc_backend_options,
                                                          RpcBackendOptions):
        raise TypeError("Argument rpc_backend_options must be an instance of RpcBackendOptions")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"RPC worker name must match {_NAME.pattern} (letters, digits, _, : "
                         f"and -, shorter than 128 characters), got {name!r}")
    if not world_size:
        raise ValueError("init_rpc needs world_size: dynamic RPC groups (world_size=None) are "
                         "not supported by ringtorch")
    options = rpc_backend_options or construct_rpc_backend_options(BackendType.TENSORPIPE)
    if not isinstance(options, TensorPipeRpcBackendOptions):
        options = TensorPipeRpcBackendOptions(rpc_timeout=options.rpc_timeout,
                                              init_method=options.init_method)
    if options.device_maps or options.devices:
        raise ValueError("ringtorch RPC moves CPU tensors only: device_maps and devices must "
                         "be empty (move CUDA tensors to the CPU before sending them)")
    with _init_lock:
        try:
            current_agent()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("RPC is already initialized")
        _start(name, rank, world_size, options)


def _start(name: str, rank: int, world_size: int, options: TensorPipeRpcBackendOptions) -> None:
    store, rank, world_size, prefix_store = _rendezvous(options.init_method, rank, world_size)
    timeout = options.rpc_timeout or 1800.0
    store.set_timeout(timedelta(seconds=timeout))
    store = prefix_store(f"rpc_prefix_{next(_init_counter)}", store)
    agent = RpcAgent(name, rank, world_size, options)
    agent.store = store  # type: ignore[attr-defined]
    agent.rref_context = RRefContext(agent)
    agent.shutdown_leader = _shutdown.ShutdownLeader(agent)  # type: ignore[attr-defined]
    set_current_agent(agent)
    try:
        agent.start(store, options.init_method, timeout)
    except BaseException:
        set_current_agent(None)
        agent.rref_context.closed = True
        agent.close()
        raise


def shutdown(graceful: bool = True, timeout: float = DEFAULT_SHUTDOWN_TIMEOUT) -> None:
    """Stop this process's agent.

    With ``graceful`` (the default), first wait until every worker has called shutdown and
    no message is in flight anywhere (user RRefs are deleted first), then close; ``timeout``
    (seconds, 0 = none) bounds that wait. Without, close at once.

    Raises:
        RuntimeError: RPC is not initialized; RpcTimeoutError / RpcPeerDiedError when the
            agreement fails (the agent is closed anyway).
    """
    agent = current_agent()
    try:
        if graceful:
            _shutdown.agree_to_close(agent, timeout)
    finally:
        agent.rref_context.closed = True
        agent.close()
        set_current_agent(None)


def get_worker_info(worker_name: Any = None) -> WorkerInfo:
    """The WorkerInfo of ``worker_name`` (a name or rank), or this worker's for None."""
    return current_agent().get_worker_info(worker_name)


def get_rpc_timeout() -> float:
    """The default timeout of calls, in seconds."""
    return current_agent().rpc_timeout


def _set_rpc_timeout(rpc_timeout: float) -> None:
    current_agent().rpc_timeout = float(rpc_timeout)


def is_available() -> bool:
    return True


def _to_worker_info(agent: RpcAgent, to: Any) -> WorkerInfo:
    if not isinstance(to, (WorkerInfo, str, int)):
        raise ValueError(f"Cannot get WorkerInfo from name {to}")
    return agent.get_worker_info(to)


class _Call:
    """What a call was, for error messages; formatted only if one is raised."""

    __slots__ = ("args", "dst", "func")

    def __init__(self, func: Callable[..., Any], args: Any, dst: WorkerInfo) -> None:
        self.func, self.args, self.dst = func, args, dst

    def __str__(self) -> str:
        if self.func is _invoke_on_owner and self.args:
            return f"RRef proxy call {self.args[0]!r}.{self.args[1]}() on {describe(self.dst)}"
        name = getattr(self.func, "__qualname__", None) or repr(self.func)
        module = getattr(self.func, "__module__", None)
        return f"{module}.{name} on {describe(self.dst)}" if module else (
            f"{name} on {describe(self.dst)}")


def _prepare(to: Any, func: Any, timeout: float) -> tuple[RpcAgent, WorkerInfo, float]:
    agent = current_agent()
    if not callable(func):
        raise TypeError("function should be callable.")
    return agent, _to_worker_info(agent, to), resolve_timeout(agent, timeout)


def rpc_sync(to: Any, func: Callable[..., Any], args: tuple[Any, ...] | None = None,
             kwargs: dict[str, Any] | None = None, timeout: float = UNSET_RPC_TIMEOUT) -> Any:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return its result.

    Raises:
        The remote exception, with its type and the remote traceback in its message;
        RpcTimeoutError after ``timeout`` (naming the function and the worker);
        RpcPeerDiedError when ``to`` dies.
    """
    agent, dst, seconds = _prepare(to, func, timeout)
    return agent.request(dst, messages.CALL, (func, args, kwargs), seconds,
                         _Call(func, args, dst), sync=True)


def rpc_async(to: Any, func: Callable[..., Any], args: tuple[Any, ...] | None = None,
              kwargs: dict[str, Any] | None = None,
              timeout: float = UNSET_RPC_TIMEOUT) -> Future[Any]:
    """As ``rpc_sync``, returning at once a Future of the result."""
    agent, dst, seconds = _prepare(to, func, timeout)
    future: Future[Any] = Future()
    agent.request(dst, messages.CALL, (func, args, kwargs), seconds,
                  _Call(func, args, dst), future=future)
    futures = getattr(_thread_local, "future_list", None)
    if futures is not None:
        futures.append(future)
    return future


def remote(to: Any, func: Callable[..., Any], args: tuple[Any, ...] | None = None,
           kwargs: dict[str, Any] | None = None, timeout: float = UNSET_RPC_TIMEOUT) -> RRef[Any]:
    """Run ``func`` on worker ``to``, keeping the result there; return an RRef to it at once.

    Errors (including a timeout) are raised when the RRef is used (``to_here``).
    """
    agent, dst, seconds = _prepare(to, func, timeout)
    return create_remote(agent, dst, func, args, kwargs, seconds,
                         _Call(func, args, dst))


@contextlib.contextmanager
def _wait_all() -> Iterator[None]:
    """Wait, on exit, for every future ``rpc_async`` returned inside the block (torch's)."""
    _thread_local.future_list = []
    try:
        yield
    finally:
        try:
            for fut in _thread_local.future_list:
                fut.wait()
        finally:
            del _thread_local.future_list


__all__ = [
    "get_rpc_timeout",
    "get_worker_info",
    "init_rpc",
    "is_available",
    "remote",
    "rpc_async",
    "rpc_sync",
    "shutdown",
]

"""The public RPC functions, with torch's names, arguments, defaults and errors.

``init_rpc`` rendezvous through ``options.init_method`` (a ``PrefixStore`` named
``rpc_prefix_{n}`` as in torch), then starts this process's agent (agent.py), which connects
to every other worker. ``rpc_sync``/``rpc_async``/``remote`` pickle ``(func, args, kwargs)``
(functions travel by name, as in torch) and send them through the call core (_calls.py, which
rref.py's calls share); a timeout of -1 means the agent's default, 0 means none. Everything
a run makes is recorded in _state.py, and ``shutdown`` empties it; ``shutdown(graceful=True)``
first waits for the global agreement of _shutdown.py.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from ringtorch._observe import trace_run
from ringtorch._observe.hang_ask import HANG
from ringtorch._observe.recorder import RECORDER
from ringtorch._observe.totals import TOTALS
from ringtorch.distributed.rpc import _calls, _devices, _shutdown
from ringtorch.distributed.rpc._rref_context import RRefContext
from ringtorch.distributed.rpc._state import STATE, current_agent
from ringtorch.distributed.rpc._workerinfo import WorkerInfo
from ringtorch.distributed.rpc.agent import RpcAgent
from ringtorch.distributed.rpc.options import (
    DEFAULT_SHUTDOWN_TIMEOUT,
    UNSET_RPC_TIMEOUT,
    BackendType,
    RpcBackendOptions,
    TensorPipeRpcBackendOptions,
    construct_rpc_backend_options,
)
from ringtorch.distributed.rpc.rref import RRef, create_remote
from ringtorch.futures import Future
from ringtorch.rendezvous import rendezvous
from ringtorch.store import PrefixStore

_NAME = re.compile(r"^[A-Za-z0-9_:\-]{1,127}$")


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
    _devices.check_options(options)
    with STATE.init_lock:
        if STATE.agent is not None:
            raise RuntimeError("RPC is already initialized")
        _start(name, rank, world_size, options)


def _start(name: str, rank: int, world_size: int, options: TensorPipeRpcBackendOptions) -> None:
    iterator = rendezvous(options.init_method, rank=rank, world_size=world_size)
    STATE.rendezvous = iterator  # kept after shutdown, as torch keeps its latest
    store, rank, world_size = next(iterator)
    timeout = options.rpc_timeout or 1800.0
    store.set_timeout(timedelta(seconds=timeout))
    store = PrefixStore(f"rpc_prefix_{STATE.init_count}", store)
    STATE.init_count += 1
    RECORDER.settle()  # this process's environment is known by now
    _devices.publish(store, name, options)
    agent = RpcAgent(name, rank, world_size, options, store)
    rrefs = RRefContext(agent)
    STATE.start_run(agent, rrefs, _shutdown.ShutdownLeader(agent))
    try:
        agent.start(timeout)
    except BaseException:
        STATE.clear_run()
        rrefs.close()
        agent.close()
        raise
    HANG.install(store.underlying_store, rank, world_size, name=name)  # answers hang reports
    trace_run.start_if_asked(store, rank, world_size)
    TOTALS.install(rank)  # running totals for the end-of-job summary


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
        if STATE.rrefs is not None:
            STATE.rrefs.close()
        agent.close()
        STATE.clear_run()


def get_worker_info(worker_name: WorkerInfo | str | int | None = None) -> WorkerInfo:
    """The WorkerInfo of ``worker_name`` (a name or rank), or this worker's for None."""
    return current_agent().get_worker_info(worker_name)


def get_rpc_timeout() -> float:
    """The default timeout of calls, in seconds."""
    return current_agent().rpc_timeout


def _set_rpc_timeout(rpc_timeout: float) -> None:
    current_agent().set_rpc_timeout(float(rpc_timeout))


def is_available() -> bool:
    return True


def rpc_sync(to: Any, func: Callable[..., Any], args: tuple[Any, ...] | None = None,
             kwargs: dict[str, Any] | None = None, timeout: float = UNSET_RPC_TIMEOUT) -> Any:
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return its result.

    Raises:
        The remote exception, with its type and the remote traceback in its message;
        RpcTimeoutError after ``timeout`` (naming the function and the worker);
        RpcPeerDiedError when ``to`` dies.
    """
    agent, dst, seconds = _calls.prepare(to, func, timeout)
    return _calls.call_sync(agent, dst, func, args, kwargs, seconds,
                            _calls.CallDescription(func, dst))


def rpc_async(to: Any, func: Callable[..., Any], args: tuple[Any, ...] | None = None,
              kwargs: dict[str, Any] | None = None,
              timeout: float = UNSET_RPC_TIMEOUT) -> Future[Any]:
    """As ``rpc_sync``, returning at once a Future of the result."""
    agent, dst, seconds = _calls.prepare(to, func, timeout)
    return _calls.call_async(agent, dst, func, args, kwargs, seconds,
                             _calls.CallDescription(func, dst))


def remote(to: Any, func: Callable[..., Any], args: tuple[Any, ...] | None = None,
           kwargs: dict[str, Any] | None = None, timeout: float = UNSET_RPC_TIMEOUT) -> RRef[Any]:
    """Run ``func`` on worker ``to``, keeping the result there; return an RRef to it at once.

    Errors (including a timeout) are raised when the RRef is used (``to_here``).
    """
    agent, dst, seconds = _calls.prepare(to, func, timeout)
    return create_remote(agent, dst, func, args, kwargs, seconds,
                         _calls.CallDescription(func, dst))


@contextlib.contextmanager
def _wait_all() -> Iterator[None]:
    """Wait, on exit, for every future ``rpc_async`` returned inside the block (torch's)."""
    thread = STATE.thread
    futures: list[Any] = []
    outer, thread.future_list = thread.future_list, futures
    try:
        yield
    finally:
        try:
            for fut in futures:
                fut.wait()
        finally:
            thread.future_list = outer


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

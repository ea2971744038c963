"""How a callee serves requests: CALL, REMOTE_CALL and the RRef protocol's messages.

Each handler is registered with extensions.register_handler at import. ``call_function`` runs a
user function (an ``@async_execution`` one returns a Future, answered when it completes);
``settle_entry`` puts a ``remote()`` result into the owner's entry (rref.py's
``create_remote``, the caller's side of ``rpc.remote``, uses both for calls to itself).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.futures

from ringtorch._observe.trace import TRACER
from ringtorch.distributed.rpc import messages
from ringtorch.distributed.rpc._calls import function_name
from ringtorch.distributed.rpc._interfaces import Agent, Handler
from ringtorch.distributed.rpc._rref_context import Id, _OwnerEntry
from ringtorch.distributed.rpc._server import (
    REMOTE_MESSAGE_ATTR,
    Deferred,
    is_future,
    remote_error_payload,
)
from ringtorch.distributed.rpc._state import current_rrefs
from ringtorch.distributed.rpc._workerinfo import WorkerInfo
from ringtorch.distributed.rpc.extensions import register_handler
from ringtorch.distributed.rpc.functions import is_async
from ringtorch.futures import Future


def fail_entry(me: WorkerInfo, entry: _OwnerEntry, exc: BaseException) -> None:
    """Record a failed creation in the owner's entry (fetches raise it, with the traceback)."""
    if not isinstance(exc, Exception):
        exc = RuntimeError(repr(exc))
    _, message = remote_error_payload(me, exc)
    try:
        setattr(exc, REMOTE_MESSAGE_ATTR, message)
    except AttributeError:
        pass
    if not entry.future.done():
        entry.future.set_exception(exc)


def settle_entry(me: WorkerInfo, entry: _OwnerEntry, run: Callable[[], Any]) -> Any:
    """Run ``run()`` into ``entry``: its value, its error, or (async functions) its future.

    Returns the value for the reply, or a Deferred when the value comes later.
    """
    try:
        result = run()
    except BaseException as exc:
        fail_entry(me, entry, exc)
        raise
    if not isinstance(result, _AsyncValue):
        entry.future.set_result(result)
        return None
    later: Future[Any] = Future()

    def done(fut: Future[Any]) -> None:
        try:
            entry.future.set_result(fut.value())
            later.set_result(None)
        except BaseException as exc:
            fail_entry(me, entry, exc)
            later.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))

    result.future.add_done_callback(done)
    return Deferred(later)


class _AsyncValue:
    __slots__ = ("future",)

    def __init__(self, future: torch.futures.Future[Any]) -> None:
        self.future = future


def call_function(func: Any, args: Any, kwargs: Any) -> Any:
    """``func(*args, **kwargs)``; an ``@async_execution`` result comes back as _AsyncValue.

    Raises:
        TypeError: an async function did not return a Future.
    """
    result = func(*(args or ()), **(kwargs or {}))
    if is_async(func):
        if not is_future(result):
            raise TypeError(f"{getattr(func, '__qualname__', func)} is decorated with "
                            f"@async_execution but returned {type(result).__name__}, "
                            f"not a Future")
        return _AsyncValue(result)
    return result


def _serve(src: WorkerInfo, func: Any, args: Any, kwargs: Any) -> Any:
    """``call_function``, shown on the timeline when tracing (the callee's side of a call)."""
    if not TRACER.on:
        return call_function(func, args, kwargs)
    with TRACER.timed("rpc", f"serve {function_name(func)} <- {src.name}", {"caller": src.name}):
        return call_function(func, args, kwargs)


def _prepare_remote(agent: Agent, src: WorkerInfo, payload: Any) -> Any:
    rref_id, fork_id, func, args, kwargs = payload
    ctx = current_rrefs()
    entry = ctx.entry(rref_id)
    ctx.add_user(entry, fork_id, src.id)
    return entry, func, args, kwargs


def _run_remote(agent: Agent, src: WorkerInfo, prepared: Any) -> Any:
    entry, func, args, kwargs = prepared
    return settle_entry(agent.info, entry, lambda: _serve(src, func, args, kwargs))


def _run_fetch(agent: Agent, src: WorkerInfo, rref_id: Id) -> Any:
    return Deferred(current_rrefs().entry(rref_id).future)


def _run_fork_request(agent: Agent, src: WorkerInfo, payload: Any) -> None:
    rref_id, fork_id = payload
    ctx = current_rrefs()
    ctx.add_user(ctx.entry(rref_id), fork_id, src.id)


def _run_child_accept(agent: Agent, src: WorkerInfo, fork_id: Id) -> None:
    current_rrefs().child_accepted(fork_id)  # on the parent


def _run_user_delete(agent: Agent, src: WorkerInfo, forks: list[tuple[Id, Id]]) -> None:
    current_rrefs().drop_users(forks, deleted=True)


def _run_call(agent: Agent, src: WorkerInfo, payload: Any) -> Any:
    func, args, kwargs = payload
    result = _serve(src, func, args, kwargs)
    return Deferred(result.future) if isinstance(result, _AsyncValue) else result


def _run_release(agent: Agent, src: WorkerInfo, message_id: int) -> None:
    agent.release_hold(src, message_id)


for _handler in (
    Handler(messages.CALL, _run_call),
    Handler(messages.RELEASE_HOLD, _run_release, inline=True),
    Handler(messages.REMOTE_CALL, _run_remote, prepare=_prepare_remote),
    Handler(messages.RREF_FETCH, _run_fetch, inline=True),
    Handler(messages.RREF_FORK_REQUEST, _run_fork_request, inline=True),
    Handler(messages.RREF_CHILD_ACCEPT, _run_child_accept, inline=True),
    Handler(messages.RREF_USER_DELETE, _run_user_delete, inline=True),
):
    register_handler(_handler)

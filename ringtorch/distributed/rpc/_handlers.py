"""How a callee serves requests: CALL, REMOTE_CALL and the RRef protocol's messages.

Each handler is registered with messages.register_handler at import. ``call_function`` runs a
user function (an ``@async_execution`` one returns a Future, answered when it completes);
``settle_entry`` puts a ``remote()`` result into the owner's entry. ``create_remote`` is the
caller's side of ``rpc.remote``.
"""

from __future__ import annotations

from typing import Any

from ringtorch.distributed.rpc import messages
from ringtorch.distributed.rpc._rref_context import Id, RRefContext, _OwnerEntry
from ringtorch.distributed.rpc._server import Deferred, is_future, remote_error_payload
from ringtorch.distributed.rpc._workerinfo import WorkerInfo
from ringtorch.distributed.rpc.agent import RpcAgent
from ringtorch.distributed.rpc.functions import is_async
from ringtorch.distributed.rpc.rref import RRef
from ringtorch.futures import Future


def fail_entry(agent: RpcAgent, entry: _OwnerEntry, exc: BaseException) -> None:
    """Record a failed creation in the owner's entry (fetches raise it, with the traceback)."""
    if not isinstance(exc, Exception):
        exc = RuntimeError(repr(exc))
    _, message = remote_error_payload(agent.info, exc)
    try:
        exc._rpc_remote_message = message  # type: ignore[attr-defined]
    except AttributeError:
        pass
    if not entry.future.done():
        entry.future.set_exception(exc)


def settle_entry(agent: RpcAgent, entry: _OwnerEntry, run: Any) -> Any:
    """Run ``run()`` into ``entry``: its value, its error, or (async functions) its future.

    Returns the value for the reply, or a Deferred when the value comes later.
    """
    try:
        result = run()
    except BaseException as exc:
        fail_entry(agent, entry, exc)
        raise
    if not isinstance(result, _AsyncValue):
        entry.future.set_result(result)
        return None
    later: Future[Any] = Future()

    def done(fut: Any) -> None:
        try:
            entry.future.set_result(fut.value())
            later.set_result(None)
        except BaseException as exc:
            fail_entry(agent, entry, exc)
            later.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))

    result.future.add_done_callback(done)
    return Deferred(later)


class _AsyncValue:
    __slots__ = ("future",)

    def __init__(self, future: Any) -> None:
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


def _prepare_remote(agent: RpcAgent, src: WorkerInfo, payload: Any) -> Any:
    rref_id, fork_id, func, args, kwargs = payload
    ctx: RRefContext = agent.rref_context
    entry = ctx.entry(rref_id)
    ctx.add_user(entry, fork_id, src.id)
    return entry, func, args, kwargs


def _run_remote(agent: RpcAgent, src: WorkerInfo, prepared: Any) -> Any:
    entry, func, args, kwargs = prepared
    return settle_entry(agent, entry, lambda: call_function(func, args, kwargs))


def _run_fetch(agent: RpcAgent, src: WorkerInfo, rref_id: Id) -> Any:
    return Deferred(agent.rref_context.entry(rref_id).future)


def _run_fork_request(agent: RpcAgent, src: WorkerInfo, payload: Any) -> None:
    rref_id, fork_id = payload
    ctx: RRefContext = agent.rref_context
    ctx.add_user(ctx.entry(rref_id), fork_id, src.id)


def _run_child_accept(agent: RpcAgent, src: WorkerInfo, fork_id: Id) -> None:
    agent.rref_context.child_accepted(fork_id)  # on the parent


def _run_user_delete(agent: RpcAgent, src: WorkerInfo, forks: list[tuple[Id, Id]]) -> None:
    agent.rref_context.drop_users(forks)


def _run_call(agent: RpcAgent, src: WorkerInfo, payload: Any) -> Any:
    func, args, kwargs = payload
    result = call_function(func, args, kwargs)
    return Deferred(result.future) if isinstance(result, _AsyncValue) else result


def _run_release(agent: RpcAgent, src: WorkerInfo, message_id: int) -> None:
    agent.release_hold(src, message_id)


for _handler in (
    messages.Handler(messages.CALL, _run_call),
    messages.Handler(messages.RELEASE_HOLD, _run_release, inline=True),
    messages.Handler(messages.REMOTE_CALL, _run_remote, prepare=_prepare_remote),
    messages.Handler(messages.RREF_FETCH, _run_fetch, inline=True),
    messages.Handler(messages.RREF_FORK_REQUEST, _run_fork_request, inline=True),
    messages.Handler(messages.RREF_CHILD_ACCEPT, _run_child_accept, inline=True),
    messages.Handler(messages.RREF_USER_DELETE, _run_user_delete, inline=True),
):
    messages.register_handler(_handler)


def create_remote(agent: RpcAgent, dst: WorkerInfo, func: Any, args: Any, kwargs: Any,
                  timeout: float, what: Any) -> RRef[Any]:
    """``rpc.remote``: start ``func`` on ``dst``; return the RRef to its result at once."""
    ctx: RRefContext = agent.rref_context
    if dst.id == agent.info.id:
        entry = _OwnerEntry(ctx.new_id())
        owner_view = RRef._make_owner(ctx, entry)

        def run_here() -> None:
            try:
                settle_entry(agent, entry, lambda: call_function(func, args, kwargs))
            except BaseException:
                pass

        assert agent.server is not None
        agent.server.pool.submit(run_here)
        return owner_view
    rref_id, fork_id = ctx.new_id(), ctx.new_id()
    user = RRef._make_user(ctx, rref_id, dst, fork_id)
    created: Future[Any] = Future()
    user._created = created

    def confirmed(value: Any, error: BaseException | None) -> None:
        if error is None:
            user._confirmed = True
        else:
            user._error = error

    agent.request(dst, messages.REMOTE_CALL, (rref_id, fork_id, func, args, kwargs), timeout,
                  what, future=created, on_done=confirmed)
    return user

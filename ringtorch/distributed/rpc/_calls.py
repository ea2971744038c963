"""The call core: how a user function call becomes a request, for api.py and rref.py alike.

``rpc_sync``/``rpc_async`` (api.py) and an RRef's own calls (``to_here``, the proxies,
``backward``, ``_get_type`` in rref.py) all resolve their destination and timeout, describe
the call for error messages and send it here, so a timeout, an unknown destination or a dead
worker reads the same whichever API made the call. ``remote()`` shares the first half
(``prepare``); making its RRef is rref.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._C._autograd import _profiler_enabled as profiler_on
from torch._C._profiler import _RecordFunctionFast

from ringtorch._observe.operation import RPC, Operation
from ringtorch._observe.recorder import RECORDER
from ringtorch.distributed.rpc import messages
from ringtorch.distributed.rpc._interfaces import Agent, RunningAgent
from ringtorch.distributed.rpc._state import STATE, current_agent
from ringtorch.distributed.rpc._workerinfo import WorkerInfo, describe
from ringtorch.distributed.rpc.options import UNSET_RPC_TIMEOUT
from ringtorch.futures import Future


def resolve_timeout(agent: Agent, timeout: float) -> float:
    """Seconds to wait (0: no limit) for a user-facing ``timeout`` argument."""
    return agent.rpc_timeout if timeout == UNSET_RPC_TIMEOUT else float(timeout)


def destination(agent: RunningAgent, to: Any) -> WorkerInfo:
    """The WorkerInfo of ``to`` (a WorkerInfo, a name or a rank).

    Raises:
        ValueError: ``to`` is none of those (torch's message).
        RuntimeError: no worker has that name or rank.
    """
    if not isinstance(to, (WorkerInfo, str, int)):
        raise ValueError(f"Cannot get WorkerInfo from name {to}")
    return agent.get_worker_info(to)


class CallDescription:
    """What a call was, for error messages; formatted only if one is raised."""

    __slots__ = ("dst", "func")

    def __init__(self, func: Callable[..., Any], dst: WorkerInfo) -> None:
        self.func, self.dst = func, dst

    def __str__(self) -> str:
        name = getattr(self.func, "__qualname__", None) or repr(self.func)
        module = getattr(self.func, "__module__", None)
        return f"{module}.{name} on {describe(self.dst)}" if module else (
            f"{name} on {describe(self.dst)}")


def prepare(to: Any, func: Any, timeout: float) -> tuple[RunningAgent, WorkerInfo, float]:
    """(agent, destination, seconds) of a call of ``func`` on ``to``.

    Raises:
        RuntimeError: RPC is not initialized; an unknown destination.
        TypeError: ``func`` is not callable (torch's message).
    """
    agent = current_agent()
    if not callable(func):
        raise TypeError("function should be callable.")
    return agent, destination(agent, to), resolve_timeout(agent, timeout)


# Where the user's frame is, for the flight recorder (as group_base.SITE_DEPTH): frames from
# record's caller up to the public function: call_async or the RRef's maker (1), rpc_async
# or remote (2); _call_sync passes one more (call_sync, then rpc_sync). Counted rather than
# walked: a walk costs more (see group_base.SITE_DEPTH).
SITE_DEPTH = 2


def record(agent: RunningAgent, op: str, dst: WorkerInfo, func: Any,
           hint: int = SITE_DEPTH) -> Operation:
    """The operation of a call the user is making, started now, and recorded by the flight
    recorder when it is on.

    ``hint``: the frames from this function's caller up to the public function (SITE_DEPTH
    unless a caller stands between)."""
    o = Operation(RPC, agent.get_worker_info().name, op, -1, dst.name, function_name(func))
    o.started = o.enqueued  # a call is under way as soon as it is issued
    if RECORDER.on:
        RECORDER.add(o, hint + 1)
    return o


def function_name(func: Any) -> str:
    """``module.name`` of a called function, as a user would write it ("torch.add")."""
    name = getattr(func, "__name__", None) or type(func).__name__
    module = getattr(func, "__module__", None)
    return f"{module}.{name}" if module else name


def finish_on(future: Future[Any], rec: Operation) -> None:
    """Stamp ``rec`` finished when ``future`` completes.

    The stamp is registered as torch's plain callback, not through Future.add_done_callback,
    which marks the future as having user callbacks (they may block, so the agent would then
    complete it on a worker thread, a hand-off that costs tens of microseconds); the stamp
    is quick and never blocks."""

    def stamp(fut: Any) -> None:
        try:
            fut.value()
        except BaseException as exc:
            RECORDER.finished(rec, exc)
        else:
            RECORDER.finished(rec, None)

    torch.futures.Future.add_done_callback(future, stamp)


def profile_range(kind: str, agent: RunningAgent, dst: WorkerInfo, func: Any,
                  args: Any) -> Any:
    """Open torch.profiler's range of a call (only while a profiler runs), named as torch
    names it: ``rpc_sync#module.func(worker0 -> worker1)``; its tensor arguments are its
    inputs and their bytes its ``nbytes``. Close it with ``end_range``."""
    tensors = [a for a in (args or ()) if isinstance(a, torch.Tensor)]
    span = _RecordFunctionFast(
        f"rpc_{kind}#{function_name(func)}({agent.get_worker_info().name} -> {dst.name})",
        tensors, {"dst": dst.name, "nbytes": sum(t.numel() * t.element_size() for t in tensors)})
    span.__enter__()
    return span


def end_range(span: Any, future: Future[Any] | None = None) -> None:
    """Close ``span`` now, or when ``future`` completes (a plain callback: see finish_on)."""
    if future is None:
        span.__exit__(None, None, None)
        return
    torch.futures.Future.add_done_callback(future, lambda _: span.__exit__(None, None, None))


def call_sync(agent: RunningAgent, dst: WorkerInfo, func: Callable[..., Any], args: Any,
              kwargs: Any, seconds: float, what: object) -> Any:
    """Run ``func(*args, **kwargs)`` on ``dst``; return its value or raise its error."""
    if profiler_on():
        span = profile_range("sync", agent, dst, func, args)
        try:
            return _call_sync(agent, dst, func, args, kwargs, seconds, what)
        finally:
            end_range(span)
    return _call_sync(agent, dst, func, args, kwargs, seconds, what)


def _call_sync(agent: RunningAgent, dst: WorkerInfo, func: Callable[..., Any], args: Any,
               kwargs: Any, seconds: float, what: object) -> Any:
    rec = record(agent, "rpc_sync", dst, func, hint=SITE_DEPTH + 1)  # rpc_sync > call_sync
    try:
        value = agent.request(dst, messages.CALL, (func, args, kwargs), seconds, what,
                              sync=True)
    except BaseException as exc:
        RECORDER.finished(rec, exc)
        raise
    RECORDER.finished(rec, None)
    return value


def call_async(agent: RunningAgent, dst: WorkerInfo, func: Callable[..., Any], args: Any,
               kwargs: Any, seconds: float, what: object) -> Future[Any]:
    """As ``call_sync``, returning at once a Future of the result (``_wait_all`` sees it)."""
    future: Future[Any] = Future()
    finish_on(future, record(agent, "rpc_async", dst, func))
    if profiler_on():
        end_range(profile_range("async", agent, dst, func, args), future)
    agent.request(dst, messages.CALL, (func, args, kwargs), seconds, what, future=future)
    futures = STATE.thread.future_list
    if futures is not None:
        futures.append(future)
    return future


__all__ = ["CallDescription", "call_async", "call_sync", "destination", "end_range", "finish_on",
           "function_name", "prepare", "profile_range", "profiler_on", "record",
           "resolve_timeout"]

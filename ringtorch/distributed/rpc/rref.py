"""Remote references: ``RRef``, how one travels in a message (a fork), and the proxies.

The protocol (docs/design/rref-protocol.md, guarantees G1-G5) in one paragraph: the owner
keeps a value while any user reference to it exists anywhere. Each user reference is a fork
with a globally unique id, recorded by the owner before it is ever used: ``remote()`` sends
its fork with the call; the owner registers a fork it sends itself before sending it; a user
that passes its reference to a third worker keeps its own reference alive (a "child" hold)
until the owner has recorded the new fork (FORK_REQUEST) and the child said so
(CHILD_ACCEPT). A user that passes a reference back to its owner keeps it alive until the
owner has loaded the message. Deleted user references are batched to their owner
(RREF_USER_DELETE); the owner drops the value when the last fork is gone. Messages between
two workers are loaded in the order they were sent, which the protocol relies on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch

from ringtorch.distributed.rpc import _calls, _serialization, messages
from ringtorch.distributed.rpc._handlers import call_function, settle_entry
from ringtorch.distributed.rpc._interfaces import RunningAgent
from ringtorch.distributed.rpc._rref_context import Id, RRefContext, _gid, _OwnerEntry
from ringtorch.distributed.rpc._state import current_agent, current_rrefs
from ringtorch.distributed.rpc._workerinfo import WorkerInfo, describe
from ringtorch.distributed.rpc.functions import async_execution, is_async
from ringtorch.distributed.rpc.options import UNSET_RPC_TIMEOUT
from ringtorch.futures import Future

T = TypeVar("T")


class RRef(Generic[T]):
    """A reference to a value that lives on one worker, its owner.

    ``RRef(value)`` makes a reference owned by this worker; ``rpc.remote`` returns one owned
    by the callee. RRefs can be passed in RPC arguments and return values; the owner keeps
    the value as long as a reference to it exists anywhere.
    """

    __slots__ = ("__weakref__", "_confirmed", "_created", "_ctx", "_deleted", "_entry",
                 "_error", "_fork_id", "_owner", "_rref_id", "_type")

    _ctx: RRefContext
    _rref_id: Id
    _owner: WorkerInfo
    _fork_id: Id | None
    _entry: _OwnerEntry | None
    _confirmed: bool
    _created: Future[Any] | None
    _error: BaseException | None
    _deleted: bool
    _type: type | None

    def __init__(self, value: T, type_hint: type | None = None) -> None:
        ctx = current_rrefs()
        entry = ctx.new_entry()
        entry.future.set_result(value)
        self._init(ctx, entry.rref_id, ctx.agent.info, None, entry)
        self._type = type_hint

    def _init(self, ctx: RRefContext, rref_id: Id, owner: WorkerInfo, fork_id: Id | None,
              entry: _OwnerEntry | None) -> None:
        self._ctx = ctx
        self._rref_id = rref_id
        self._owner = owner
        self._fork_id = fork_id
        self._entry = entry
        self._confirmed = fork_id is None
        self._created = None
        self._error = None
        self._deleted = False
        self._type = None

    @classmethod
    def _make_owner(cls, ctx: RRefContext, entry: _OwnerEntry) -> RRef[Any]:
        rref = cls.__new__(cls)
        rref._init(ctx, entry.rref_id, ctx.agent.info, None, entry)
        return rref

    @classmethod
    def _make_user(cls, ctx: RRefContext, rref_id: Id, owner: WorkerInfo,
                   fork_id: Id) -> RRef[Any]:
        rref = cls.__new__(cls)
        rref._init(ctx, rref_id, owner, fork_id, None)
        ctx.add_user_reference(rref)
        return rref

    def _confirm(self) -> None:
        self._confirmed = True

    def __del__(self) -> None:
        # Only appends to a deque (no lock): __del__ may run on any thread at any moment.
        try:
            if self._fork_id is not None and not self._deleted and not self._ctx.closed:
                self._ctx.deletes.append((self._owner.id, self._rref_id, self._fork_id))
        except AttributeError:  # half-built, or the interpreter is shutting down
            pass

    def _release(self) -> None:
        if self._fork_id is not None and not self._deleted:
            self._deleted = True
            self._ctx.deletes.append((self._owner.id, self._rref_id, self._fork_id))

    def is_owner(self) -> bool:
        """Whether this worker owns the value."""
        return self._fork_id is None

    def owner(self) -> WorkerInfo:
        """The WorkerInfo of the owner."""
        return self._owner

    def owner_name(self) -> str:
        """The name of the owner."""
        return self._owner.name

    def confirmed_by_owner(self) -> bool:
        """Whether the owner has recorded this reference (always True on the owner)."""
        return self._confirmed

    def local_value(self) -> T:
        """The value itself, on the owner (waits if ``remote()`` is still computing it).

        Raises:
            RuntimeError: called on a user; the creation error if the value failed.
        """
        if self._entry is None:
            raise RuntimeError(f"For {self!r}, can't call localValue() on user "
                               f"{self._ctx.agent.info}. Call it on owner {self._owner}")
        return self._entry.future.wait()

    def to_here(self, timeout: float = UNSET_RPC_TIMEOUT) -> T:
        """A copy of the value, fetched from the owner (the value itself on the owner).

        Raises:
            The error of the ``remote()`` that made this RRef, RpcTimeoutError, or
            RpcPeerDiedError when the owner is gone.
        """
        if self._entry is not None:
            return self.local_value()
        self._check_usable()
        agent = self._ctx.agent
        return agent.request(self._owner, messages.RREF_FETCH, self._rref_id,
                             _calls.resolve_timeout(agent, timeout),
                             f"RRef.to_here() of {self!r} from {describe(self._owner)}",
                             sync=True)

    def _check_usable(self) -> None:
        if self._deleted:
            raise RuntimeError(f"{self!r} was deleted when RPC shut down")
        if self._error is not None:
            raise self._error

    def rpc_sync(self, timeout: float = UNSET_RPC_TIMEOUT) -> Any:
        """A proxy: ``rref.rpc_sync().f(*args)`` runs ``value.f(*args)`` on the owner."""
        return _Proxy(self, _calls.call_sync, timeout)

    def rpc_async(self, timeout: float = UNSET_RPC_TIMEOUT) -> Any:
        """As ``rpc_sync()``, returning a Future of the method's result."""
        return _Proxy(self, _calls.call_async, timeout)

    def remote(self, timeout: float = UNSET_RPC_TIMEOUT) -> Any:
        """As ``rpc_sync()``, returning an RRef (owned by this RRef's owner) to the result."""
        return _Proxy(self, create_remote, timeout)

    def backward(self, dist_autograd_ctx_id: int = -1, retain_graph: bool = False) -> None:
        """Run a backward pass from this RRef's value (a scalar tensor), as torch's does.

        With ``dist_autograd_ctx_id``, a distributed backward of that context starting on the
        owner (read the gradients with ``dist_autograd.get_gradients``); without it, a local
        ``value.backward()``, which only the owner may call.

        Raises:
            RuntimeError: a local backward on a worker that is not the owner, a value that is
                not a tensor, or what ``dist_autograd.backward`` raises.
        """
        if dist_autograd_ctx_id == -1:
            if not self.is_owner():
                raise RuntimeError(
                    f"RRef.backward without a dist_autograd_ctx_id runs a local backward, which "
                    f"only the owner ({self._owner.name}) may run; pass the context id for a "
                    f"distributed backward")
            _tensor_value(self).backward(retain_graph=retain_graph)
        elif self.is_owner():
            _backward_on_owner(self, dist_autograd_ctx_id, retain_graph)
        else:
            agent, dst, seconds = _calls.prepare(self._owner, _backward_on_owner,
                                                 UNSET_RPC_TIMEOUT)
            _calls.call_sync(agent, dst, _backward_on_owner,
                             (self, dist_autograd_ctx_id, retain_graph), None, seconds,
                             _calls.CallDescription(_backward_on_owner, dst))

    def _get_future(self) -> Future[Any]:
        """A future completed when the owner has created the value (torch's private API)."""
        if self._created is None:
            done: Future[Any] = Future()
            if self._error is not None:
                done.set_exception(self._error)
            else:
                done.set_result(None)
            return done
        return self._created

    def _get_type(self, timeout: float = UNSET_RPC_TIMEOUT, blocking: bool = True) -> Any:
        """The type of the value (fetched from the owner once, then cached)."""
        if self._type is None:
            if self._entry is not None:
                self._type = type(self.local_value())
            else:
                agent, dst, seconds = _calls.prepare(self._owner, _type_on_owner, timeout)
                self._type = _calls.call_sync(agent, dst, _type_on_owner, (self,), None,
                                              seconds, _calls.CallDescription(_type_on_owner,
                                                                              dst))
        if blocking:
            return self._type
        fut: Future[Any] = Future()
        fut.set_result(self._type)
        return fut

    def __repr__(self) -> str:
        if self._fork_id is None:
            return f"OwnerRRef({_gid(self._rref_id)})"
        return f"UserRRef(RRefId = {_gid(self._rref_id)}, ForkId = {_gid(self._fork_id)})"

    def __reduce__(self) -> Any:
        raise RuntimeError("RRef can only be pickled by the RPC framework: pass it as an "
                           "argument or return value of rpc_sync, rpc_async or remote")


def _reduce_rref(rref: RRef[Any]) -> tuple[Any, ...]:
    """How an RRef travels in an RPC message to ``encode_context().dst`` (a fork)."""
    ectx = _serialization.encode_context()
    ctx = rref._ctx
    if ctx.closed:
        raise RuntimeError(f"{rref!r} belongs to an RPC agent that was shut down")
    me = ctx.agent.info.id
    entry = rref._entry
    if entry is not None:  # the owner forks: record the fork before it leaves (G2)
        fork_id = ctx.new_id()
        ctx.add_user(entry, fork_id, ectx.dst)
        ectx.rollback.append(lambda: ctx.drop_users([(rref._rref_id, fork_id)]))
        return (_rebuild_rref, ((rref._rref_id, me, fork_id, me),))
    rref._check_usable()
    if ectx.dst == rref._owner.id:  # back to the owner: keep ours until it is loaded (G4)
        ectx.holds.append(rref)
        return (_rebuild_rref, ((rref._rref_id, rref._owner.id, None, me),))
    fork_id = ctx.new_id()  # to a third worker: hold ours until the owner knows (G3)
    ctx.hold_child(fork_id, rref, ectx.dst)
    ectx.rollback.append(lambda: ctx.child_accepted(fork_id))
    return (_rebuild_rref, ((rref._rref_id, rref._owner.id, fork_id, me),))


def _rebuild_rref(data: tuple[Id, int, Id | None, int]) -> RRef[Any]:
    rref_id, owner, fork_id, parent = data
    ctx = current_rrefs()
    if owner == ctx.agent.info.id:
        entry = ctx.entry(rref_id)
        if fork_id is not None:  # a fork this worker sent itself: the view replaces it
            ctx.drop_users([(rref_id, fork_id)])
        return RRef._make_owner(ctx, entry)
    assert fork_id is not None
    user = RRef._make_user(ctx, rref_id, ctx.agent.worker(owner), fork_id)
    if parent == owner:
        user._confirmed = True
    else:
        ctx.request_fork(rref_id, fork_id, user._owner, parent, user._confirm)
    return user


_serialization.register_reducer(RRef, _reduce_rref)


def _tensor_value(rref: RRef[Any]) -> Any:
    value = rref.local_value()
    if not isinstance(value, torch.Tensor):
        raise RuntimeError(f"RRef should contain a tensor for .backward(), but {rref!r} holds "
                           f"a {type(value).__name__}")
    return value


def _backward_on_owner(rref: RRef[Any], context_id: int, retain_graph: bool) -> None:
    """(on the owner) The distributed backward of ``rref.backward(context_id)``: run by the
    autograd hook (attached on first use: rpc/ may not import distributed autograd)."""
    value = _tensor_value(rref)
    current_agent().context_hook().backward(context_id, [value], retain_graph)


def _type_on_owner(rref: RRef[Any]) -> type:
    return type(rref.local_value())


@async_execution
def _invoke_on_owner(rref: RRef[Any], name: str, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Future[Any]:
    """Run ``value.name(*args, **kwargs)`` on the owner (the proxies' remote function)."""
    value = rref.local_value()
    result = getattr(value, name)(*args, **kwargs)
    if is_async(getattr(type(value), name, None)):
        return result
    done: Future[Any] = Future()
    done.set_result(result)
    return done


class _ProxyDescription:
    """What a proxy call was, for error messages; formatted only if one is raised."""

    __slots__ = ("dst", "name", "rref")

    def __init__(self, rref: RRef[Any], name: str, dst: WorkerInfo) -> None:
        self.rref, self.name, self.dst = rref, name, dst

    def __str__(self) -> str:
        return f"RRef proxy call {self.rref!r}.{self.name}() on {describe(self.dst)}"


_Launch = Callable[[RunningAgent, WorkerInfo, Callable[..., Any], Any, Any, float, object], Any]


class _Proxy:
    """``rref.rpc_sync()`` and friends: attribute access builds the remote method call."""

    def __init__(self, rref: RRef[Any], launch: _Launch, timeout: float) -> None:
        self._rref = rref
        self._launch = launch
        self._timeout = timeout

    def __getattr__(self, name: str) -> Any:
        return functools.partial(_proxy_call, self._rref, self._launch, name, self._timeout)


def _proxy_call(rref: RRef[Any], launch: _Launch, name: str, timeout: float, *args: Any,
                **kwargs: Any) -> Any:
    agent, dst, seconds = _calls.prepare(rref.owner(), _invoke_on_owner, timeout)
    return launch(agent, dst, _invoke_on_owner, (rref, name, args, kwargs), None, seconds,
                  _ProxyDescription(rref, name, dst))


def create_remote(agent: RunningAgent, dst: WorkerInfo, func: Callable[..., Any], args: Any,
                  kwargs: Any, seconds: float, what: object) -> RRef[Any]:
    """``rpc.remote``: start ``func`` on ``dst``; return the RRef to its result at once."""
    ctx = current_rrefs()
    if dst.id == agent.info.id:
        entry = ctx.new_entry()
        owner_view = RRef._make_owner(ctx, entry)

        def run_here() -> None:
            try:
                settle_entry(agent.info, entry, lambda: call_function(func, args, kwargs))
            except BaseException:
                pass  # kept in the entry: to_here() raises it

        agent.submit(run_here)
        return owner_view
    rref_id, fork_id = ctx.new_id(), ctx.new_id()
    user = RRef._make_user(ctx, rref_id, dst, fork_id)
    created: Future[Any] = Future()
    user._created = created
    _calls.finish_on(created, _calls.record(agent, "remote", dst, func))
    if _calls.profiler_on():
        _calls.end_range(_calls.profile_range("remote", agent, dst, func, args), created)

    def confirmed(value: Any, error: BaseException | None) -> None:
        if error is None:
            user._confirmed = True
        else:
            user._error = error

    agent.request(dst, messages.REMOTE_CALL, (rref_id, fork_id, func, args, kwargs), seconds,
                  what, future=created, on_done=confirmed)
    return user


__all__ = ["RRef"]

"""What the RPC tests share: starting RPC on a rank, catching errors, functions workers call on
each other, values whose collection the owner records, and waits on the agent's and the RRef
context's ``statistics()`` (the tests order events with these, never with sleeps).

Functions called over RPC live at module level, so every rank can load them by name.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

import ringtorch.distributed.rpc as rpc
from ringtorch.distributed.rpc._interfaces import AgentStatistics
from ringtorch.distributed.rpc._rref_context import RRefStatistics
from ringtorch.distributed.rpc._state import current_agent, current_rrefs
from ringtorch.distributed.rpc.agent import RpcAgent
from ringtorch.futures import Future
from ringtorch.store import TCPStore
from ringtorch.testing import wait_for


def start(rank: int, world_size: int, *, timeout: float = 20.0, threads: int = 16) -> None:
    """init_rpc with the harness's env:// rendezvous."""
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=threads, rpc_timeout=timeout)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size, rpc_backend_options=options)


def error_of(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, str]:
    """(type name, message) of what ``fn`` raises; ("", "") if it returns."""
    try:
        fn(*args, **kwargs)
    except BaseException as exc:
        return type(exc).__name__, str(exc)
    return "", ""


def timed_error(fn: Any, *args: Any) -> tuple[str, str, float]:
    started = time.monotonic()
    name, message = error_of(fn, *args)
    return name, message, time.monotonic() - started


def wait_until(condition: Callable[[], bool], seconds: float = 15.0) -> bool:
    """Poll ``condition`` (a read of some state) until it holds; False after ``seconds``
    (the ranks hand that back as their answer, for the test to assert)."""
    try:
        # every 5 ms: the hostile-client tests poll the agent's statistics in the very
        # process whose accept loop and CPU time they measure
        wait_for(condition, seconds, interval=0.005)
    except TimeoutError:
        return False
    return True


def agent_statistics() -> AgentStatistics:
    """This worker's agent's ``statistics()``."""
    agent = current_agent()
    assert isinstance(agent, RpcAgent)
    return agent.statistics()


def rref_statistics() -> RRefStatistics:
    """This worker's RRef context's ``statistics()`` (callable over RPC)."""
    return current_rrefs().statistics()


def side_store() -> TCPStore:
    """A client of the job's store (rank 0 hosts it), for the test's own signals."""
    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                    timedelta(seconds=60))


# ---- functions called over RPC ---------------------------------------------------------

def add(a: Any, b: Any) -> Any:
    return a + b


def echo(x: Any) -> Any:
    return x


def raise_value_error(text: str) -> None:
    raise ValueError(text)


_sleeping: list[float] = []  # one entry per sleep_then call started in this process
_slept: list[float] = []     # one entry per sleep_then call finished in this process


def sleep_then(seconds: float, value: Any = None) -> Any:
    _sleeping.append(seconds)
    time.sleep(seconds)
    _slept.append(seconds)
    return value


def wait_sleepers() -> bool:
    """Returns once every sleep_then call started here has finished."""
    return wait_until(lambda: len(_slept) == len(_sleeping))


_events: dict[str, threading.Event] = {}
_waiting: dict[str, int] = {}
_lock = threading.Lock()


def wait_event(name: str) -> str:
    with _lock:
        event = _events.setdefault(name, threading.Event())
        _waiting[name] = _waiting.get(name, 0) + 1
    return "set" if event.wait(timeout=10) else "not set"


def set_event(name: str) -> None:
    with _lock:
        _events.setdefault(name, threading.Event()).set()


def until_waiting(name: str) -> bool:
    """Returns once a wait_event(name) call is waiting here."""
    return wait_until(lambda: _waiting.get(name, 0) > 0)


# ---- values owned through RRefs, with finalizers ---------------------------------------

_freed: set[str] = set()
_kept: dict[str, Any] = {}


class Tracked:
    """A value whose collection the owner records (weakref.finalize)."""

    def __init__(self, tag: str, data: Any = None) -> None:
        self.tag = tag
        self.data = data
        weakref.finalize(self, _freed.add, tag)

    def get(self) -> Any:
        return self.data

    def plus(self, x: Any) -> Any:
        return self.data + x

    @rpc.functions.async_execution
    def plus_later(self, x: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        threading.Timer(0.05, lambda: fut.set_result(self.data + x)).start()
        return fut


def freed(tag: str) -> bool:
    gc.collect()
    return tag in _freed


def wait_freed(tag: str, seconds: float) -> bool:  # callers give 15 s: under the 20 s RPC timeout
    return wait_for(lambda: freed(tag), seconds, f"the object tagged {tag!r} to be freed",
                    interval=0.02)  # each poll runs a full gc.collect()


def keep(name: str, value: Any) -> None:
    _kept[name] = value


def drop(name: str) -> None:
    _kept.pop(name, None)
    gc.collect()


def kept_to_here(name: str) -> Any:
    return _kept[name].to_here()


def local_data(rref: rpc.RRef[Any]) -> Any:
    return rref.local_value().data


def make_rrefs(tag: str, n: int) -> list[rpc.RRef[Any]]:
    """RRefs this worker owns, returned to the caller (as seed 004's _parameter_rrefs)."""
    return [rpc.RRef(Tracked(f"{tag}{i}", torch.full((2,), float(i)))) for i in range(n)]


def forward_rref(to: str, rref: rpc.RRef[Any]) -> Any:
    """Pass an RRef on to a third worker, which fetches its value."""
    return rpc.rpc_sync(to, fetch, args=(rref,))


def fetch(rref: rpc.RRef[Any]) -> Any:
    return rref.to_here()


def remote_method(method: Any, rref: rpc.RRef[Any], *args: Any) -> Any:
    """Seed 004's helper: call ``method`` on the owner's value."""
    return rpc.rpc_sync(rref.owner(), _call_method, args=[method, rref, *args])


def _call_method(method: Any, rref: rpc.RRef[Any], *args: Any) -> Any:
    return method(rref.local_value(), *args)

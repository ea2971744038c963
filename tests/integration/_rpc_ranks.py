"""Rank-side code of the RPC tests: the functions workers call on each other, and scenarios.

Every scenario starts RPC on its rank (``worker{rank}``), does its part, shuts RPC down and
returns what it saw; the test modules assert on those results with values they compute
themselves. Functions called over RPC live at module level here, so every rank can load them.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import threading
import time
import traceback
import weakref
from typing import Any

import torch

import ringtorch.distributed.rpc as rpc
from ringtorch.futures import Future


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


# ---- functions called over RPC ---------------------------------------------------------

def add(a: Any, b: Any) -> Any:
    return a + b


def echo(x: Any) -> Any:
    return x


def whoami() -> str:
    return rpc.get_worker_info().name


def scaled(x: Any, *, factor: float = 1.0) -> Any:
    return x * factor


_sleeping: list[float] = []  # one entry per sleep_then call started in this process


def sleep_then(seconds: float, value: Any = None) -> Any:
    _sleeping.append(seconds)
    time.sleep(seconds)
    return value


class CustomError(Exception):
    pass


class NeedsTwoArgs(Exception):
    def __init__(self, a: str, b: str) -> None:
        super().__init__(a, b)


def raise_value_error(text: str) -> None:
    raise ValueError(text)


def raise_custom() -> None:
    raise CustomError("custom failure")


def raise_two_args() -> None:
    raise NeedsTwoArgs("x", "y")


def unpicklable_result() -> Any:
    return threading.Lock()


@rpc.functions.async_execution
def async_add_chained(to: str, x: Any, y: Any, z: Any) -> Future[Any]:
    return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)


@rpc.functions.async_execution
def async_not_a_future() -> int:
    return 3


class AsyncExecutionClass:
    @staticmethod
    @rpc.functions.async_execution
    def static_async_add(to: str, x: Any, y: Any, z: Any) -> Future[Any]:
        return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)

    @classmethod
    @rpc.functions.async_execution
    def class_async_add(cls, to: str, x: Any, y: Any, z: Any) -> Future[Any]:
        ret: Future[Any] = Future()
        rpc.rpc_async(to, torch.add, args=(x, y)).then(
            lambda fut: ret.set_result(fut.wait() + z))
        return ret

    @rpc.functions.async_execution
    def bound_async_add(self, to: str, x: Any, y: Any, z: Any) -> Future[Any]:
        return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)


_barriers: dict[str, threading.Barrier] = {}
_events: dict[str, threading.Event] = {}
_lock = threading.Lock()


def meet(name: str, parties: int) -> int:
    """Returns once ``parties`` calls are inside at the same time (they run concurrently)."""
    with _lock:
        barrier = _barriers.setdefault(name, threading.Barrier(parties))
    return barrier.wait(timeout=10)


def wait_event(name: str) -> str:
    with _lock:
        event = _events.setdefault(name, threading.Event())
    return "set" if event.wait(timeout=10) else "not set"


def set_event(name: str) -> None:
    with _lock:
        _events.setdefault(name, threading.Event()).set()


def nested_sync(to: str, x: Any) -> Any:
    return rpc.rpc_sync(to, add, args=(x, 1)) * 2


_log: list[Any] = []


def append_later(seconds: float, item: Any) -> None:
    time.sleep(seconds)
    _log.append(item)


def log() -> list[Any]:
    return list(_log)


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
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if freed(tag):
            return True
        time.sleep(0.02)
    return freed(tag)


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


def owner_table_size() -> int:
    from ringtorch.distributed.rpc.agent import current_agent

    return len(current_agent().rref_context.owners)


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


# ---- scenarios -----------------------------------------------------------------------------

def exchange(rank: int, ws: int) -> dict[str, Any]:
    """Every worker calls every worker (itself included) in every way."""
    start(rank, ws)
    out: dict[str, Any] = {}
    me = rpc.get_worker_info()
    out["me"] = (me.name, me.id, repr(me))
    for peer in range(ws):
        name = f"worker{peer}"
        info = rpc.get_worker_info(name)
        out[f"sync{peer}"] = rpc.rpc_sync(name, add, args=(torch.ones(2) * rank, peer))
        out[f"by_rank{peer}"] = rpc.rpc_sync(peer, whoami)
        out[f"by_info{peer}"] = rpc.rpc_sync(info, whoami)
        out[f"kwargs{peer}"] = rpc.rpc_sync(name, scaled, args=(torch.arange(3.0),),
                                            kwargs={"factor": rank + 2})
        out[f"builtin{peer}"] = rpc.rpc_sync(name, torch.add, args=(torch.ones(2), rank))
        out[f"async{peer}"] = rpc.rpc_async(name, add, args=(rank, peer)).wait()
        out[f"remote{peer}"] = rpc.remote(name, add, args=(torch.ones(2), peer)).to_here()
    futs = [rpc.rpc_async(f"worker{p}", add, args=(rank, p)) for p in range(ws)]
    out["wait_all"] = torch.futures.wait_all(futs)
    out["timeout_default"] = rpc.get_rpc_timeout()
    rpc.shutdown()
    return out


def tensors(rank: int, ws: int, values: dict[str, Any]) -> dict[str, Any]:
    """Worker 0 echoes every value through worker 1; both check what they received."""
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        for key, value in values.items():
            out[key] = rpc.rpc_sync("worker1", echo, args=(value,))
        big = torch.arange(1 << 20, dtype=torch.float32)  # 4 MB: by reference on one host
        out["big_sum"] = rpc.rpc_sync("worker1", torch.sum, args=(big,)).item()
        out["big_back"] = torch.equal(rpc.rpc_sync("worker1", echo, args=(big,)), big)
        strided = torch.arange(24.0).reshape(4, 6)[:, ::2]
        out["strided"] = rpc.rpc_sync("worker1", echo, args=(strided,))
        grad = torch.ones(3, requires_grad=True)
        out["requires_grad"] = rpc.rpc_sync("worker1", echo, args=(grad,)).requires_grad
        param = torch.nn.Parameter(torch.ones(2))
        out["parameter"] = type(rpc.rpc_sync("worker1", echo, args=(param,))).__name__
        out["module"] = rpc.rpc_sync("worker1", echo, args=(torch.nn.Linear(2, 3),))
        out["meta"] = error_of(rpc.rpc_sync, "worker1", echo, args=(torch.ones(2,
                                                                             device="meta"),))
        many = [torch.full((3,), float(i)) for i in range(100)]  # more buffers than one sendmsg
        out["many"] = rpc.rpc_sync("worker1", echo, args=(many,))
        out["big_pickle"] = rpc.rpc_sync("worker1", echo, args=(list(range(100_000)),))
        from ringtorch.distributed.rpc.agent import current_agent

        conn = current_agent().outgoing[1]
        out["family"] = conn.sock.family.name  # type: ignore[attr-defined]
    rpc.shutdown()
    return out


def errors(rank: int, ws: int) -> dict[str, Any]:
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        out["value"] = error_of(rpc.rpc_sync, "worker1", raise_value_error, args=("bad x",))
        out["async"] = error_of(rpc.rpc_async("worker1", raise_value_error, args=("y",)).wait)
        out["custom"] = error_of(rpc.rpc_sync, "worker1", raise_custom)
        out["two_args"] = error_of(rpc.rpc_sync, "worker1", raise_two_args)
        out["unpicklable"] = error_of(rpc.rpc_sync, "worker1", unpicklable_result)
        globals()["only_here"] = _only_here
        out["missing_fn"] = error_of(rpc.rpc_sync, "worker1", _only_here)
        out["unknown"] = error_of(rpc.rpc_sync, "nobody", add, args=(1, 2))
        out["bad_rank"] = error_of(rpc.rpc_sync, 7, add, args=(1, 2))
        out["bad_to"] = error_of(rpc.rpc_sync, 1.5, add, args=(1, 2))
        out["not_callable"] = error_of(rpc.rpc_sync, "worker1", 3)
        out["arg_unpicklable"] = error_of(rpc.rpc_sync, "worker1", echo,
                                          args=(threading.Lock(),))
        out["async_not_future"] = error_of(rpc.rpc_sync, "worker1", async_not_a_future)
        out["still_works"] = rpc.rpc_sync("worker1", add, args=(2, 3))
        out["again"] = error_of(rpc.init_rpc, "worker0", rank=0, world_size=ws)
        out["pickle_rref"] = error_of(pickle.dumps, rpc.RRef(1))
    rpc.shutdown()
    return out


def _only_here() -> int:  # made importable as `only_here` on rank 0 only (see errors())
    return 1


_only_here.__qualname__ = _only_here.__name__ = "only_here"


def timeouts(rank: int, ws: int) -> dict[str, Any]:
    start(rank, ws, timeout=0.4)
    out: dict[str, Any] = {}
    if rank == 0:
        out["sync"] = timed_error(rpc.rpc_sync, "worker1", sleep_then, (1.0,), None, 0.2)
        fut = rpc.rpc_async("worker1", sleep_then, args=(1.0,), timeout=0.2)
        out["async"] = timed_error(fut.wait)
        out["default"] = timed_error(rpc.rpc_sync, "worker1", sleep_then, (1.0,))
        out["infinite"] = rpc.rpc_sync("worker1", sleep_then, args=(0.6, "done"), timeout=0)
        rref = rpc.remote("worker1", sleep_then, args=(1.0, "late"), timeout=0.2)
        time.sleep(0.4)
        out["remote"] = timed_error(rref.to_here)
        out["to_here"] = timed_error(rpc.remote("worker1", sleep_then, args=(1.0, 1)).to_here,
                                     0.2)
        out["after"] = rpc.rpc_sync("worker1", add, args=(1, 1))
        time.sleep(1.0)  # let the slow calls finish before shutting down
    rpc.shutdown()
    return out


def async_functions(rank: int, ws: int) -> dict[str, Any]:
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        x = torch.ones(2)
        out["chained"] = rpc.rpc_sync("worker1", async_add_chained, args=("worker2", x, 1, 1))
        out["static"] = rpc.rpc_sync("worker1", AsyncExecutionClass.static_async_add,
                                     args=("worker2", x, 1, 2))
        out["class"] = rpc.rpc_sync("worker1", AsyncExecutionClass.class_async_add,
                                    args=("worker2", x, 1, 2))
        rref = rpc.remote("worker1", AsyncExecutionClass)
        out["bound"] = rref.rpc_sync().bound_async_add("worker2", x, 1, 3)
        out["proxy_static"] = rref.rpc_async().static_async_add("worker2", x, 1, 2).wait()
        out["proxy_remote"] = rref.remote().static_async_add("worker2", x, 1, 2).to_here()
        out["nested_sync"] = rpc.rpc_sync("worker1", nested_sync, args=("worker2", 5))
        out["then"] = rpc.rpc_async("worker1", add, args=(2, 3)).then(
            lambda f: f.value() * 10).wait()
        out["callback_calls"] = rpc.rpc_async("worker1", add, args=(1, 1)).then(
            lambda f: rpc.rpc_sync("worker1", add, args=(f.value(), 1))).wait()
    rpc.shutdown()
    return out


def concurrency(rank: int, ws: int, threads: int) -> dict[str, Any]:
    start(rank, ws, threads=threads)
    out: dict[str, Any] = {}
    if rank == 0:
        futs = [rpc.rpc_async("worker1", meet, args=("four", threads)) for _ in range(threads)]
        out["met"] = sorted(f.wait() for f in futs)
        results: dict[int, list[Any]] = {}

        def caller(index: int) -> None:
            results[index] = [rpc.rpc_sync("worker1", add, args=(index, i)) for i in range(50)]

        callers = [threading.Thread(target=caller, args=(i,)) for i in range(4)]
        for thread in callers:
            thread.start()
        for thread in callers:
            thread.join()
        out["threads"] = results
        blocked = rpc.rpc_async("worker1", wait_event, args=("e1",))
        time.sleep(0.05)
        rpc.rpc_sync("worker1", set_event, args=("e1",))  # same connection as `blocked`
        out["unblocked"] = blocked.wait()
    rpc.shutdown()
    return out


def graceful(rank: int, ws: int) -> dict[str, Any]:
    """Each non-zero worker fires a slow call at worker 0 and shuts down at once."""
    start(rank, ws)
    if rank != 0:
        rpc.rpc_async("worker0", append_later, args=(0.3, rank))
    rpc.shutdown()
    out = {"log": sorted(_log)} if rank == 0 else {}
    out["after"] = error_of(rpc.rpc_sync, "worker0", add, args=(1, 1))
    return out


def restart(rank: int, ws: int) -> dict[str, Any]:
    """A single worker: shut down without the agreement, then start RPC again."""
    out: dict[str, Any] = {}
    for round_ in range(2):
        start(rank, ws)
        out[f"round{round_}"] = rpc.rpc_sync("worker0", add, args=(round_, 1))
        rpc.shutdown(graceful=False)
    return out


# ---- RRef scenarios ----------------------------------------------------------------------

def rref_api(rank: int, ws: int) -> dict[str, Any]:
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        rref = rpc.remote("worker1", Tracked, args=("api", torch.arange(3.0)))
        out["owner"] = (rref.owner().name, rref.owner_name(), rref.is_owner())
        out["to_here"] = rref.to_here().data
        out["confirmed"] = rref.confirmed_by_owner()
        out["local_on_user"] = error_of(rref.local_value)
        out["proxy_sync"] = rref.rpc_sync().plus(1)
        out["proxy_async"] = rref.rpc_async().plus(2).wait()
        out["proxy_remote"] = rref.remote().plus(3).to_here()
        out["proxy_async_method"] = rref.rpc_sync().plus_later(4)
        out["on_owner"] = rpc.rpc_sync("worker1", local_data, args=(rref,))
        out["seed_style"] = remote_method(Tracked.plus, rref, 5)
        out["type"] = rref._get_type().__name__
        mine = rpc.RRef({"k": 1})
        out["local"] = (mine.is_owner(), mine.owner_name(), mine.to_here() is mine.local_value(),
                        mine.confirmed_by_owner())
        out["local_fetched"] = rpc.rpc_sync("worker1", fetch, args=(mine,))
        here = rpc.remote("worker0", add, args=(1, 2))
        out["remote_self"] = (here.is_owner(), here.to_here())
        bad = rpc.remote("worker1", raise_value_error, args=("no value",))
        out["creation_error"] = error_of(bad.to_here)
        out["creation_error_fork"] = error_of(rpc.rpc_sync, "worker1", fetch, args=(bad,))
        out["repr"] = repr(rref)
    rpc.shutdown()
    return out


def rref_lifetime(rank: int, ws: int) -> dict[str, Any]:
    """G1/G3: the owner (worker1) keeps a value while a user anywhere holds a reference."""
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        rref = rpc.remote("worker1", Tracked, args=("life", torch.ones(2)))
        rref.to_here()
        rpc.rpc_sync("worker2", keep, args=("r", rref))  # a fork to worker2 (G3)
        del rref
        gc.collect()
        time.sleep(0.5)  # worker0's delete reaches the owner (batched every 0.1 s)
        out["alive_while_forked"] = not rpc.rpc_sync("worker1", freed, args=("life",))
        out["fork_usable"] = rpc.rpc_sync("worker2", kept_to_here, args=("r",)).data.tolist()
        rpc.rpc_sync("worker2", drop, args=("r",))
        out["freed_after_last"] = rpc.rpc_sync("worker1", wait_freed, args=("life", 15.0))
        # G2: RRefs the owner creates and returns (seed 004's _parameter_rrefs)
        params = rpc.rpc_sync("worker1", make_rrefs, args=("p", 2))
        out["returned_confirmed"] = [r.confirmed_by_owner() for r in params]
        out["returned_values"] = [r.to_here().data.tolist() for r in params]
        out["returned_on_owner"] = rpc.rpc_sync("worker1", local_data, args=(params[1],)
                                                ).tolist()
        del params
        gc.collect()
        out["returned_freed"] = [rpc.rpc_sync("worker1", wait_freed, args=(f"p{i}", 15.0))
                                 for i in range(2)]
        # G4: a reference passed back to its owner survives its deletion in flight
        rref = rpc.remote("worker1", Tracked, args=("back", torch.full((2,), 7.0)))
        fut = rpc.rpc_async("worker1", _slow_local_data, args=(rref,))
        del rref
        gc.collect()
        out["back_value"] = fut.wait().tolist()
        out["back_freed"] = rpc.rpc_sync("worker1", wait_freed, args=("back", 15.0))
        # a fork passed from worker2 on to worker3-like third party: worker2 -> worker0
        rref = rpc.remote("worker1", Tracked, args=("chain", torch.ones(1)))
        out["chain"] = rpc.rpc_sync("worker2", forward_rref, args=("worker0", rref)).data.item()
        del rref
        gc.collect()
        out["chain_freed"] = rpc.rpc_sync("worker1", wait_freed, args=("chain", 15.0))
        out["owner_table"] = rpc.rpc_sync("worker1", owner_table_size)
        _side_store().set("rref checks done", "1")
    else:  # a graceful shutdown deletes this worker's user RRefs (worker2's kept fork) first
        _side_store().wait(["rref checks done"])
    rpc.shutdown()
    return out


def _slow_local_data(rref: rpc.RRef[Any]) -> Any:
    time.sleep(0.3)
    gc.collect()
    return rref.local_value().data


# ---- failures ----------------------------------------------------------------------------

def killed_worker(rank: int, ws: int, victim: int) -> dict[str, Any]:
    """``victim`` runs RPC in a forked child that is SIGKILLed while calls to it are pending."""
    if rank == victim:
        pid = os.fork()
        if pid == 0:
            try:
                start(rank, ws)
                deadline = time.monotonic() + 30
                while len(_sleeping) < 2 and time.monotonic() < deadline:
                    time.sleep(0.01)  # die once worker0's two sleep_then calls are running here
                os.kill(os.getpid(), signal.SIGKILL)
            finally:
                os._exit(1)
        _, status = os.waitpid(pid, 0)
        return {"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None}
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        name = f"worker{victim}"
        rref = rpc.remote(name, Tracked, args=("v", 1))
        rref.to_here()
        fut = rpc.rpc_async(name, sleep_then, args=(20.0,))
        out["pending_sync"] = timed_error(rpc.rpc_sync, name, sleep_then, (20.0,))
        out["pending_async"] = timed_error(fut.wait)
        out["later"] = timed_error(rpc.rpc_sync, name, add, (1, 1))
        out["later_remote"] = timed_error(rpc.remote(name, add, args=(1, 1)).to_here)
        out["to_here"] = timed_error(rref.to_here)
        out["others_fine"] = [rpc.rpc_sync(f"worker{p}", add, args=(p, 1))
                              for p in range(ws) if p != victim]
        for p in range(1, ws):
            if p != victim:
                rpc.rpc_sync(f"worker{p}", set_event, args=("checks done",))
    else:
        out["waited"] = wait_event("checks done")
    # The leader (worker0) answers the others' shutdown reports ("worker1 died"); its own
    # shutdown fails at once and closes its agent, so it shuts down after theirs have been
    # answered, or their reports could find it closed ("worker0 closed its connection").
    signals = _side_store()
    if rank == 0:
        signals.wait([f"shut down/{p}" for p in range(1, ws) if p != victim])
    out["shutdown"] = timed_error(rpc.shutdown)
    if rank != 0:
        signals.set(f"shut down/{rank}", "1")
    return out


def _side_store() -> Any:
    """A client of the job's store (rank 0 hosts it), for the test's own signals."""
    from datetime import timedelta

    from ringtorch.store import TCPStore

    return TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                    timedelta(seconds=60))


def shutdown_timeout(rank: int, ws: int, marker: str) -> tuple[str, str, float]:
    """Worker 1 shuts down with a 0.5 s timeout while worker 0 is still busy; worker 0 shuts
    down once worker 1's shutdown has given up (it creates ``marker``) and it has seen worker 1
    leave (else its own report may wait at the leader until it does: another message)."""
    start(rank, ws)
    if rank == 0:
        from ringtorch.distributed.rpc.agent import current_agent

        deadline = time.monotonic() + 30  # worker1 gave up and left, and we have seen it leave
        while (not os.path.exists(marker) or 1 not in current_agent().dead) and (
                time.monotonic() < deadline):
            time.sleep(0.01)
        return timed_error(rpc.shutdown)
    result = timed_error(rpc.shutdown, True, 0.5)
    open(marker, "w").close()
    return result


def kill_me() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def dead_user(rank: int, ws: int) -> dict[str, Any]:
    """G5: worker2 (a forked child) holds the only reference to a value on worker1, then
    dies; the owner frees the value."""
    if rank == 2:
        pid = os.fork()
        if pid == 0:
            try:
                start(rank, ws)
                time.sleep(30)
            finally:
                os._exit(1)
        os.waitpid(pid, 0)
        return {}
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        rref = rpc.remote("worker1", Tracked, args=("orphan", 1))
        rpc.rpc_sync("worker2", keep, args=("r", rref))
        del rref
        gc.collect()
        time.sleep(0.5)
        out["alive"] = not rpc.rpc_sync("worker1", freed, args=("orphan",))
        out["kill"] = error_of(rpc.rpc_sync, "worker2", kill_me)[0]
        out["freed"] = rpc.rpc_sync("worker1", wait_freed, args=("orphan", 15.0))
        rpc.rpc_sync("worker1", set_event, args=("checks done",))
    else:
        wait_event("checks done")
    out["shutdown"] = error_of(rpc.shutdown)[0]
    return out


def tcp_tensors(rank: int, ws: int) -> dict[str, Any]:
    """Two workers that believe they are on different hosts: TCP, bytes in the stream."""
    os.environ["RINGTORCH_HOST_ID"] = f"host{rank}"
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        from ringtorch.distributed.rpc.agent import current_agent

        big = torch.arange(1 << 20, dtype=torch.float32)
        out["big_back"] = torch.equal(rpc.rpc_sync("worker1", echo, args=(big,)), big)
        out["family"] = current_agent().outgoing[1].sock.family.name  # type: ignore[attr-defined]
        out["by_reference"] = current_agent().reads_me[1]
    rpc.shutdown()
    return out


def handshake_guard(rank: int, ws: int, secret: str) -> dict[str, Any]:
    """Connections without the job secret are refused before anything is unpickled."""
    import socket as socketlib

    from ringtorch._wire.handshake import SERVICE_RPC, client_handshake
    from ringtorch.distributed.rpc.agent import current_agent

    os.environ["RINGTORCH_SECRET"] = secret
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        address = current_agent()._listener.address  # type: ignore[union-attr]
        canary = f"/tmp/ringtorch-rpc-canary-{os.getpid()}"
        payload = pickle.dumps(_Canary(canary))
        for label, key in (("wrong", b"not the secret"), ("none", None)):
            sock = socketlib.create_connection((address["host"], address["port"]))
            try:
                client_handshake(sock, SERVICE_RPC, time.monotonic() + 5, "test", b"{}",
                                 secret=key, use_env_secret=False)
                out[label] = ("accepted", "")
            except Exception as exc:
                out[label] = (type(exc).__name__, str(exc))
            try:
                sock.sendall(payload)
            except OSError:
                pass
            sock.close()
        raw = socketlib.create_connection((address["host"], address["port"]))
        try:
            raw.sendall(b"RP" + payload)  # no handshake at all: bytes of a pickle
            raw.settimeout(5)
            out["raw_closed"] = raw.recv(100)
        except OSError as exc:
            out["raw_closed"] = repr(exc)
        raw.close()
        time.sleep(0.2)
        out["canary"] = os.path.exists(canary)
        out["works"] = rpc.rpc_sync("worker1", add, args=(1, 2))
    rpc.shutdown()
    return out


class _Canary:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


def describe_traceback() -> str:
    return traceback.format_exc()





# ---- seed 004: the RNN model split between a parameter server and a trainer (CPU) --------
# The seed's code with `.cuda()` dropped (no GPU here) and nothing else changed.

class EmbeddingTable(torch.nn.Module):
    def __init__(self, ntoken: int, ninp: int, dropout: float) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(dropout)
        self.encoder = torch.nn.Embedding(ntoken, ninp)
        self.encoder.weight.data.uniform_(-0.1, 0.1)

    def forward(self, input: Any) -> Any:
        return self.drop(self.encoder(input))


class Decoder(torch.nn.Module):
    def __init__(self, ntoken: int, nhid: int, dropout: float) -> None:
        super().__init__()
        self.drop = torch.nn.Dropout(dropout)
        self.decoder = torch.nn.Linear(nhid, ntoken)
        self.decoder.bias.data.zero_()
        self.decoder.weight.data.uniform_(-0.1, 0.1)

    def forward(self, output: Any) -> Any:
        return self.decoder(self.drop(output))


def _parameter_rrefs(module: torch.nn.Module) -> list[rpc.RRef[Any]]:
    param_rrefs = []
    for param in module.parameters():
        param_rrefs.append(rpc.RRef(param))
    return param_rrefs


class RNNModel(torch.nn.Module):
    def __init__(self, ps: str, ntoken: int, ninp: int, nhid: int, nlayers: int,
                 dropout: float = 0.5) -> None:
        super().__init__()
        self.emb_table_rref = rpc.remote(ps, EmbeddingTable, args=(ntoken, ninp, dropout))
        self.rnn = torch.nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder_rref = rpc.remote(ps, Decoder, args=(ntoken, nhid, dropout))

    def forward(self, input: Any, hidden: Any) -> Any:
        emb = remote_method(EmbeddingTable.forward, self.emb_table_rref, input)
        output, hidden = self.rnn(emb, hidden)
        decoded = remote_method(Decoder.forward, self.decoder_rref, output)
        return decoded, hidden

    def parameter_rrefs(self) -> list[rpc.RRef[Any]]:
        remote_params = []
        remote_params.extend(remote_method(_parameter_rrefs, self.emb_table_rref))
        remote_params.extend(_parameter_rrefs(self.rnn))
        remote_params.extend(remote_method(_parameter_rrefs, self.decoder_rref))
        return remote_params


def seed004(rank: int, ws: int) -> dict[str, Any]:
    """The trainer runs the seed's model forward; the test checks it against a local copy."""
    name = "ps" if rank == 0 else "trainer"
    rpc.init_rpc(name, rank=rank, world_size=ws)
    out: dict[str, Any] = {}
    if rank == 1:
        torch.manual_seed(0)
        model = RNNModel("ps", ntoken=10, ninp=4, nhid=5, nlayers=1, dropout=0.0)
        tokens = torch.randint(10, (3, 2))
        hidden = (torch.zeros(1, 2, 5), torch.zeros(1, 2, 5))
        decoded, _ = model(tokens, hidden)
        params = model.parameter_rrefs()
        out.update(tokens=tokens, decoded=decoded.detach(),
                   owners=[p.owner_name() for p in params],
                   params=[p.to_here().detach() for p in params])
    rpc.shutdown()
    return out

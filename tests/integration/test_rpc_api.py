"""rpc_sync, rpc_async, remote, async functions, timeouts, the worker pool and shutdown, with
2 to 4 real worker processes. Each scenario (the code every rank runs) sits above the tests
that read its results; expected values are computed here with torch."""

from __future__ import annotations

import functools
import os
import pickle
import re
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch

import ringtorch.distributed.rpc as rpc
from ringtorch.distributed.rpc._state import STATE
from ringtorch.futures import Future
from ringtorch.testing import run_ranks
from tests.integration import _rpc_common as C
from tests.integration._rpc_common import (
    add,
    echo,
    error_of,
    raise_value_error,
    set_event,
    sleep_then,
    start,
    timed_error,
    until_waiting,
    wait_event,
)

# ---- every worker calls every worker ----------------------------------------------------

def whoami() -> str:
    return rpc.get_worker_info().name


def scaled(x: Any, *, factor: float = 1.0) -> Any:
    return x * factor


def exchange_scenario(rank: int, ws: int) -> dict[str, Any]:
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


@functools.cache
def exchange(ws: int) -> list[dict]:
    return run_ranks(exchange_scenario, ws, timeout=60)


@pytest.mark.parametrize("ws", [2, 4])
def test_every_worker_calls_every_worker_by_name_rank_and_worker_info(ws: int) -> None:
    for rank, out in enumerate(exchange(ws)):
        assert out["me"] == (f"worker{rank}", rank, f"WorkerInfo(id={rank}, name=worker{rank})")
        for peer in range(ws):
            assert torch.equal(out[f"sync{peer}"], torch.ones(2) * rank + peer)
            assert out[f"by_rank{peer}"] == out[f"by_info{peer}"] == f"worker{peer}"
            assert out[f"async{peer}"] == rank + peer


@pytest.mark.parametrize("ws", [2, 4])
def test_kwargs_builtins_remote_and_torch_wait_all(ws: int) -> None:
    for rank, out in enumerate(exchange(ws)):
        for peer in range(ws):
            assert torch.equal(out[f"kwargs{peer}"], torch.arange(3.0) * (rank + 2))
            assert torch.equal(out[f"builtin{peer}"], torch.ones(2) + rank)
            assert torch.equal(out[f"remote{peer}"], torch.ones(2) + peer)
        assert out["wait_all"] == [rank + p for p in range(ws)]
        assert out["timeout_default"] == 20.0



# ---- tensors and arrays ----------------------------------------------------------------

def tensors_scenario(rank: int, ws: int, values: dict[str, Any]) -> dict[str, Any]:
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
        out["family"] = C.agent_statistics().transports[1]
    rpc.shutdown()
    return out


VALUES = {
    "f32": torch.arange(6.0).reshape(2, 3),
    "bf16": torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16),
    "bool": torch.tensor([True, False, True]),
    "c64": torch.tensor([1 + 2j, -3j], dtype=torch.complex64),
    "empty": torch.zeros(0, 3),
    "scalar": torch.tensor(3),
    "numpy": np.arange(5, dtype=np.int16),
    "nested": {"a": [torch.ones(1), (2, "x")], "b": None},
}


@functools.cache
def tensors() -> dict:
    return run_ranks(tensors_scenario, 2, args=(VALUES,), timeout=60)[0]


def test_tensors_and_arrays_of_every_kind_come_back_equal() -> None:
    out = tensors()
    for key in ("f32", "bf16", "bool", "c64", "empty", "scalar"):
        assert out[key].dtype == VALUES[key].dtype and torch.equal(out[key], VALUES[key]), key
    np.testing.assert_array_equal(out["numpy"], VALUES["numpy"])
    assert out["numpy"].dtype == np.int16
    assert torch.equal(out["nested"]["a"][0], torch.ones(1))
    assert out["nested"]["a"][1] == (2, "x") and out["nested"]["b"] is None
    assert torch.equal(out["strided"], torch.arange(24.0).reshape(4, 6)[:, ::2])


def test_many_buffers_and_a_large_pickle_in_one_message() -> None:
    out = tensors()
    assert len(out["many"]) == 100
    for i, tensor in enumerate(out["many"]):
        assert torch.equal(tensor, torch.full((3,), float(i)))
    assert out["big_pickle"] == list(range(100_000))


def test_a_4mb_tensor_goes_by_unix_socket_and_memory_reference_on_one_host() -> None:
    out = tensors()
    assert out["family"] == "AF_UNIX"
    assert out["big_sum"] == float(np.arange(1 << 20, dtype=np.float64).sum())
    assert out["big_back"] is True


def test_requires_grad_parameters_and_modules_cross() -> None:
    out = tensors()
    assert out["requires_grad"] is True
    assert out["parameter"] == "Parameter"
    assert isinstance(out["module"], torch.nn.Linear)


def test_a_tensor_off_the_cpu_is_refused_at_the_caller() -> None:
    name, message = tensors()["meta"]
    assert name == "RuntimeError"
    assert message.startswith("TensorPipe RPC backend only supports CPU tensors by default")


def tcp_tensors(rank: int, ws: int) -> dict[str, Any]:
    """Two workers that believe they are on different hosts: TCP, bytes in the stream."""
    os.environ["RINGTORCH_HOST_ID"] = f"host{rank}"
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        big = torch.arange(1 << 20, dtype=torch.float32)
        out["big_back"] = torch.equal(rpc.rpc_sync("worker1", echo, args=(big,)), big)
        stats = C.agent_statistics()
        out["family"], out["by_reference"] = stats.transports[1], stats.by_reference[1]
    rpc.shutdown()
    return out


def test_workers_on_different_hosts_use_tcp_with_the_bytes_in_the_stream() -> None:
    out = run_ranks(tcp_tensors, 2, timeout=60)[0]
    assert out == {"big_back": True, "family": "AF_INET", "by_reference": False}



# ---- errors ----------------------------------------------------------------------------

class CustomError(Exception):
    pass


class NeedsTwoArgs(Exception):
    def __init__(self, a: str, b: str) -> None:
        super().__init__(a, b)


def raise_custom() -> None:
    raise CustomError("custom failure")


def raise_two_args() -> None:
    raise NeedsTwoArgs("x", "y")


def unpicklable_result() -> Any:
    return threading.Lock()


@rpc.functions.async_execution
def async_not_a_future() -> int:
    return 3


def errors_scenario(rank: int, ws: int) -> dict[str, Any]:
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


@functools.cache
def errors() -> dict:
    return run_ranks(errors_scenario, 2, timeout=60)[0]


def _remote(name: str, text: str) -> str:
    return (rf"^On WorkerInfo\(id=1, name=worker1\):\n{name}\({text}\)\n"
            rf"Traceback \(most recent call last\):\n")


def test_a_remote_exception_is_raised_with_its_type_and_the_remote_traceback() -> None:
    name, message = errors()["value"]
    assert name == "ValueError"
    assert re.match(_remote("ValueError", "'bad x'"), message)
    assert 'in raise_value_error\n    raise ValueError(text)\nValueError: bad x\n' in message
    name, message = errors()["async"]
    assert name == "ValueError" and re.match(_remote("ValueError", "'y'"), message)


def test_user_exception_classes_keep_their_type() -> None:
    name, message = errors()["custom"]
    assert name == "CustomError"
    assert re.match(_remote("CustomError", "'custom failure'"), message)


def test_an_exception_that_cannot_be_rebuilt_becomes_a_runtime_error_saying_so() -> None:
    name, message = errors()["two_args"]
    assert name == "RuntimeError"
    assert message.startswith("Failed to create original exception type. Error msg was "
                              "NeedsTwoArgs.__init__() missing 1 required positional argument: "
                              "'b' Original exception on remote side was On WorkerInfo(id=1, "
                              "name=worker1):\nNeedsTwoArgs('x', 'y')\n")


def test_an_unpicklable_result_or_argument_is_an_error() -> None:
    name, message = errors()["unpicklable"]
    assert name == "TypeError" and "cannot pickle '_thread.lock' object" in message
    assert errors()["arg_unpicklable"] == ("TypeError", "cannot pickle '_thread.lock' object")


def test_a_function_the_callee_does_not_have_gets_torchs_hint() -> None:
    name, message = errors()["missing_fn"]
    assert name == "AttributeError"
    assert "Can't get attribute 'only_here'" in message
    assert ("Default RPC pickler does not serialize function code. Ensure that UDFs are "
            "defined on both caller and callee modules.") in message


def test_unknown_destinations_are_clear_errors() -> None:
    out = errors()
    assert out["unknown"] == ("RuntimeError", "unknown destination worker 'nobody': the "
                                              "workers of this RPC group are ['worker0', "
                                              "'worker1']")
    assert out["bad_rank"] == ("RuntimeError", "unknown destination worker 7: the workers of "
                                               "this RPC group are ['worker0', 'worker1']")
    assert out["bad_to"] == ("ValueError", "Cannot get WorkerInfo from name 1.5")
    assert out["not_callable"] == ("TypeError", "function should be callable.")


def test_an_async_function_must_return_a_future() -> None:
    name, message = errors()["async_not_future"]
    assert name == "TypeError"
    assert ("async_not_a_future is decorated with @async_execution but returned int, not a "
            "Future") in message


def test_errors_leave_the_worker_serving_and_init_twice_is_refused() -> None:
    assert errors()["still_works"] == 5
    assert errors()["again"] == ("RuntimeError", "RPC is already initialized")


def test_an_rref_cannot_be_pickled_outside_rpc() -> None:
    assert errors()["pickle_rref"] == (
        "RuntimeError", "RRef can only be pickled by the RPC framework: pass it as an argument "
                        "or return value of rpc_sync, rpc_async or remote")



# ---- timeouts --------------------------------------------------------------------------

def timeouts_scenario(rank: int, ws: int) -> dict[str, Any]:
    start(rank, ws, timeout=0.4)
    out: dict[str, Any] = {}
    if rank == 0:
        out["sync"] = timed_error(rpc.rpc_sync, "worker1", sleep_then, (1.0,), None, 0.2)
        fut = rpc.rpc_async("worker1", sleep_then, args=(1.0,), timeout=0.2)
        out["async"] = timed_error(fut.wait)
        out["default"] = timed_error(rpc.rpc_sync, "worker1", sleep_then, (1.0,))
        out["infinite"] = rpc.rpc_sync("worker1", sleep_then, args=(0.6, "done"), timeout=0)
        rref = rpc.remote("worker1", sleep_then, args=(1.0, "late"), timeout=0.2)
        error_of(rref._get_future().wait)  # the remote's own timeout has struck
        out["remote"] = timed_error(rref.to_here)
        out["to_here"] = timed_error(rpc.remote("worker1", sleep_then, args=(1.0, 1)).to_here,
                                     0.2)
        out["after"] = rpc.rpc_sync("worker1", add, args=(1, 1))
        out["slept"] = rpc.rpc_sync("worker1", C.wait_sleepers, timeout=0)
    rpc.shutdown()
    return out


@functools.cache
def timeouts() -> dict:
    return run_ranks(timeouts_scenario, 2, timeout=60)[0]


def _timeout(seconds: str, what: str) -> str:
    return (f"RPC ran for more than set timeout ({seconds} s) and will now be marked with an "
            f"error: {what}")


SLEEP = "tests.integration._rpc_common.sleep_then on worker 'worker1' (rank 1)"


@pytest.mark.parametrize("case, seconds", [("sync", "0.2"), ("async", "0.2"),
                                           ("default", "0.4")])
def test_a_timeout_names_the_function_and_the_worker(case: str, seconds: str) -> None:
    name, message, took = timeouts()[case]
    assert (name, message) == ("RpcTimeoutError", _timeout(seconds, SLEEP))
    assert took < float(seconds) + 2.0


def test_timeout_zero_means_no_timeout() -> None:
    assert timeouts()["infinite"] == "done"


def test_g6_a_timed_out_remote_raises_when_its_rref_is_used() -> None:
    name, message, _ = timeouts()["remote"]
    assert (name, message) == ("RpcTimeoutError", _timeout("0.2", SLEEP))
    name, message, took = timeouts()["to_here"]
    assert name == "RpcTimeoutError" and took < 2.2
    assert message.startswith(_timeout("0.2", "RRef.to_here() of UserRRef(RRefId = "))
    assert timeouts()["after"] == 2
    assert timeouts()["slept"] is True



# ---- async functions, the worker pool, shutdown ----------------------------------------

@rpc.functions.async_execution
def async_add_chained(to: str, x: Any, y: Any, z: Any) -> Future[Any]:
    return rpc.rpc_async(to, torch.add, args=(x, y)).then(lambda fut: fut.wait() + z)


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


def nested_sync(to: str, x: Any) -> Any:
    return rpc.rpc_sync(to, add, args=(x, 1)) * 2


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


def test_async_execution_functions_static_class_and_bound_methods() -> None:
    out = run_ranks(async_functions, 3, timeout=60)[0]
    for key, extra in (("chained", 2), ("static", 3), ("class", 3), ("bound", 4),
                       ("proxy_static", 3), ("proxy_remote", 3)):
        assert torch.equal(out[key], torch.ones(2) + extra), key
    assert out["nested_sync"] == 12
    assert out["then"] == 50
    assert out["callback_calls"] == 3


_barriers: dict[str, threading.Barrier] = {}
_lock = threading.Lock()


def meet(name: str, parties: int) -> int:
    """Returns once ``parties`` calls are inside at the same time (they run concurrently)."""
    with _lock:
        barrier = _barriers.setdefault(name, threading.Barrier(parties))
    return barrier.wait(timeout=10)


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
        rpc.rpc_sync("worker1", until_waiting, args=("e1",))  # `blocked` waits there now
        rpc.rpc_sync("worker1", set_event, args=("e1",))  # same connection as `blocked`
        out["unblocked"] = blocked.wait()
    rpc.shutdown()
    return out


def test_calls_run_concurrently_on_the_worker_pool_and_never_wait_behind_a_blocked_one() -> None:
    out = run_ranks(concurrency, 2, args=(4,), timeout=60)[0]
    assert out["met"] == [0, 1, 2, 3]  # four calls inside one barrier at once
    assert out["threads"] == {t: [t + i for i in range(50)] for t in range(4)}  # 4 callers
    assert out["unblocked"] == "set"  # set by a later call on the same connection


_log: list[Any] = []


def append_later(seconds: float, item: Any) -> None:
    time.sleep(seconds)
    _log.append(item)


def log() -> list[Any]:
    return list(_log)


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


def test_graceful_shutdown_waits_for_the_work_of_every_worker() -> None:
    results = run_ranks(graceful, 3, timeout=60)
    assert results[0]["log"] == [1, 2]
    for out in results:
        assert out["after"] == ("RuntimeError", "RPC has not been initialized. Call "
                                                "ringtorch.distributed.rpc.init_rpc first.")


def test_rpc_starts_again_after_a_shutdown_without_agreement() -> None:
    assert run_ranks(restart, 1, timeout=60)[0] == {"round0": 1, "round1": 2}


def state_after_shutdown(rank: int, ws: int) -> dict[str, Any]:
    """Everything a run made is in the state object, and shutdown() empties it."""
    out: dict[str, Any] = {"empty_before": STATE.run_is_empty()}
    start(rank, ws)
    out["running"] = (STATE.agent is not None, STATE.rrefs is not None,
                      STATE.shutdown_leader is not None)
    kept = rpc.RRef(torch.ones(1))
    out["fetched"] = rpc.rpc_sync(f"worker{(rank + 1) % ws}", C.fetch, args=(kept,)).item()
    rpc.shutdown()
    out["empty_after"] = STATE.run_is_empty()
    out["not_initialized"] = error_of(rpc.get_worker_info)
    out["init_count"] = STATE.init_count
    return out


def test_shutdown_empties_the_rpc_state() -> None:
    for out in run_ranks(state_after_shutdown, 2, timeout=60):
        assert out["empty_before"] is True
        assert out["running"] == (True, True, True)
        assert out["fetched"] == 1.0
        assert out["empty_after"] is True
        assert out["not_initialized"] == ("RuntimeError", "RPC has not been initialized. Call "
                                                          "ringtorch.distributed.rpc.init_rpc "
                                                          "first.")
        assert out["init_count"] == 1  # outlives the run: the next init uses fresh store keys

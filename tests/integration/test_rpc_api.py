"""rpc_sync, rpc_async, remote, async functions, timeouts, the worker pool and shutdown, with
2 to 4 real worker processes. Expected values are computed here with torch."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest
import torch

from ringtorch.testing import run_ranks
from tests.integration import _rpc_ranks as R


@functools.cache
def exchange(ws: int) -> list[dict]:
    return run_ranks(R.exchange, ws, timeout=60)


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
    return run_ranks(R.tensors, 2, args=(VALUES,), timeout=60)[0]


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


def test_workers_on_different_hosts_use_tcp_with_the_bytes_in_the_stream() -> None:
    out = run_ranks(R.tcp_tensors, 2, timeout=60)[0]
    assert out == {"big_back": True, "family": "AF_INET", "by_reference": False}


@functools.cache
def errors() -> dict:
    return run_ranks(R.errors, 2, timeout=60)[0]


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


@functools.cache
def timeouts() -> dict:
    return run_ranks(R.timeouts, 2, timeout=60)[0]


def _timeout(seconds: str, what: str) -> str:
    return (f"RPC ran for more than set timeout ({seconds} s) and will now be marked with an "
            f"error: {what}")


SLEEP = "tests.integration._rpc_ranks.sleep_then on worker 'worker1' (rank 1)"


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


def test_async_execution_functions_static_class_and_bound_methods() -> None:
    out = run_ranks(R.async_functions, 3, timeout=60)[0]
    for key, extra in (("chained", 2), ("static", 3), ("class", 3), ("bound", 4),
                       ("proxy_static", 3), ("proxy_remote", 3)):
        assert torch.equal(out[key], torch.ones(2) + extra), key
    assert out["nested_sync"] == 12
    assert out["then"] == 50
    assert out["callback_calls"] == 3


def test_calls_run_concurrently_on_the_worker_pool_and_never_wait_behind_a_blocked_one() -> None:
    out = run_ranks(R.concurrency, 2, args=(4,), timeout=60)[0]
    assert out["met"] == [0, 1, 2, 3]  # four calls inside one barrier at once
    assert out["threads"] == {t: [t + i for i in range(50)] for t in range(4)}  # 4 callers
    assert out["unblocked"] == "set"  # set by a later call on the same connection


def test_graceful_shutdown_waits_for_the_work_of_every_worker() -> None:
    results = run_ranks(R.graceful, 3, timeout=60)
    assert results[0]["log"] == [1, 2]
    for out in results:
        assert out["after"] == ("RuntimeError", "RPC has not been initialized. Call "
                                                "ringtorch.distributed.rpc.init_rpc first.")


def test_rpc_starts_again_after_a_shutdown_without_agreement() -> None:
    assert run_ranks(R.restart, 1, timeout=60)[0] == {"round0": 1, "round1": 2}

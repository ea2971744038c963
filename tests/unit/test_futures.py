"""ringtorch.futures.Future: torch.futures.Future's API and semantics, and interoperability."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from ringtorch.futures import Future, collect_all, wait_all


def test_a_future_is_a_torch_future() -> None:
    assert isinstance(Future(), torch.futures.Future)


def test_set_result_then_wait_and_value_return_it() -> None:
    fut: Future[int] = Future()
    assert not fut.done()
    fut.set_result(5)
    assert fut.done()
    assert fut.wait() == 5
    assert fut.value() == 5


def test_wait_blocks_until_another_thread_sets_the_result() -> None:
    fut: Future[str] = Future()
    threading.Timer(0.05, fut.set_result, ("late",)).start()
    assert fut.wait() == "late"


def test_set_exception_is_raised_by_wait_and_value_with_its_type() -> None:
    fut: Future[int] = Future()
    fut.set_exception(KeyError("k"))
    assert fut.done()
    with pytest.raises(KeyError, match="k"):
        fut.wait()
    with pytest.raises(KeyError, match="k"):
        fut.value()


def test_set_exception_rejects_what_is_not_an_exception_with_torchs_message() -> None:
    with pytest.raises(AssertionError, match=r"^boom is of type <class 'str'>, not an Exception\.$"):
        Future().set_exception("boom")  # type: ignore[arg-type]


def test_a_future_completes_only_once() -> None:
    fut: Future[int] = Future()
    fut.set_result(1)
    with pytest.raises(RuntimeError, match="Future can only be marked completed once"):
        fut.set_result(2)


def test_value_before_done_raises_a_clear_error() -> None:
    with pytest.raises(RuntimeError, match=r"^Future\.value\(\) was called on a future that "
                                           r"is not done yet; call wait\(\) \(or use then\(\)\) "
                                           r"instead$"):
        Future().value()


def test_devices_are_refused() -> None:
    with pytest.raises(ValueError, match="CPU values only"):
        Future(devices=["cuda:0"])


def test_then_chains_and_returns_a_ringtorch_future() -> None:
    fut: Future[int] = Future()
    child = fut.then(lambda f: f.value() + 1).then(lambda f: f.value() * 10)
    assert isinstance(child, Future)
    fut.set_result(1)
    assert child.wait() == 20


def test_then_on_a_done_future_runs_the_callback_inline() -> None:
    fut: Future[int] = Future()
    fut.set_result(2)
    seen: list[str] = []
    fut.then(lambda f: seen.append(threading.current_thread().name))
    assert seen == [threading.current_thread().name]


def test_an_error_in_a_then_callback_is_a_runtime_error_naming_it_as_torch_does() -> None:
    fut: Future[int] = Future()
    child = fut.then(lambda f: 1 / 0)
    fut.set_result(1)
    with pytest.raises(RuntimeError, match=r"^Got the following error when running the callback: "
                                           r"ZeroDivisionError: division by zero$") as info:
        child.wait()
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_add_done_callbacks_all_run_with_the_future() -> None:
    fut: Future[int] = Future()
    record: list[int] = []
    fut.add_done_callback(lambda f: record.append(f.value()))
    fut.add_done_callback(lambda f: record.append(f.value() * 2))
    fut.set_result(3)
    assert sorted(record) == [3, 6]


def test_collect_all_completes_with_the_futures_once_all_are_done() -> None:
    futs: list[Future[int]] = [Future(), Future()]
    combined = collect_all(futs)
    futs[1].set_result(1)
    assert not combined.done()
    futs[0].set_result(0)
    assert [f.value() for f in combined.wait()] == [0, 1]


def test_collect_all_of_nothing_is_done() -> None:
    assert collect_all([]).wait() == []


def test_collect_all_fails_with_the_first_error_as_torch_does() -> None:
    futs: list[Future[int]] = [Future(), Future()]
    combined = collect_all(futs)
    futs[1].set_exception(ValueError("second failed"))
    with pytest.raises(ValueError, match="second failed"):
        combined.wait()


def test_wait_all_returns_the_values_in_order() -> None:
    futs: list[Future[int]] = [Future() for _ in range(3)]
    for i, fut in enumerate(reversed(futs)):
        threading.Timer(0.01 * i, fut.set_result, (i,)).start()
    assert wait_all(futs) == [2, 1, 0]


def test_wait_all_raises_the_error() -> None:
    futs: list[Future[int]] = [Future(), Future()]
    futs[0].set_result(0)
    futs[1].set_exception(TypeError("bad"))
    with pytest.raises(TypeError, match="bad"):
        wait_all(futs)


def test_torch_wait_all_accepts_ringtorch_futures() -> None:
    futs: list[Future[int]] = [Future(), Future()]
    futs[0].set_result(4)
    threading.Timer(0.02, futs[1].set_result, (5,)).start()
    assert torch.futures.wait_all(futs) == [4, 5]


def test_ringtorch_wait_all_accepts_torch_futures() -> None:
    fut: torch.futures.Future[int] = torch.futures.Future()
    fut.set_result(9)
    assert wait_all([fut]) == [9]


def test_wait_runs_the_blocking_hooks_only_when_it_would_block() -> None:
    import ringtorch.futures as futures

    calls: list[float] = []
    remove = futures.register_blocking_wait_hook(lambda: calls.append(time.monotonic()))
    try:
        done: Future[int] = Future()
        done.set_result(1)
        done.wait()
        assert calls == []
        later: Future[int] = Future()
        threading.Timer(0.01, later.set_result, (2,)).start()
        later.wait()
        assert len(calls) == 1
    finally:
        remove()

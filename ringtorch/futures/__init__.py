"""Future with torch.futures.Future's API, usable wherever torch expects one.

``ringtorch.futures.Future`` subclasses ``torch.futures.Future`` (a C++ future): code that
mixes the two keeps working (``torch.futures.wait_all`` on ringtorch futures, a
``torch.futures.Future`` returned from an ``@async_execution`` function), and waiting costs
what torch's costs. Measured on the 2-core dev box: creating, completing and waiting on one
costs 2.0 µs either way, and a cross-thread wake-up is the same futex in both (about 37 µs
against 45 µs for ``concurrent.futures.Future``); a pure-Python future would save 1.8 µs per
call and lose the interoperability, so we subclass.

What we add over torch's class: ``then`` returns a ringtorch ``Future``; ``value()`` on a
future that is not done raises a clear error instead of torch's internal assert; and
``wait()`` first gives up the RPC connection-reader role when it is called from inside an RPC
being served inline (the hook the RPC agent registers with :func:`register_blocking_wait_hook`),
so a blocking wait there cannot stall the connection it arrived on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import torch
import torch.futures

T = TypeVar("T")
S = TypeVar("S")

# Called (with no argument) before a Future.wait() that would block. The RPC agent installs
# a hook here that hands the connection it is serving inline to another thread. The futures
# layer may not import rpc (it sits below it), hence a hook.
_before_blocking_wait: list[Callable[[], None]] = []


def register_blocking_wait_hook(hook: Callable[[], None]) -> Callable[[], None]:
    """Run ``hook()`` before every ``Future.wait()`` that would block (not on a done future).

    Returns:
        A function that removes the hook again.
    """
    _before_blocking_wait.append(hook)
    return lambda: _before_blocking_wait.remove(hook)


def _callback_error(exc: BaseException) -> RuntimeError:
    # torch reports an exception raised inside a `then` callback this way (same prefix),
    # as a RuntimeError whatever the original type; we also chain the original.
    err = RuntimeError(f"Got the following error when running the callback: "
                       f"{type(exc).__name__}: {exc}")
    err.__cause__ = exc
    return err


class Future(torch.futures.Future, Generic[T]):
    """A value that will be ready later: the result of ``rpc_async``, ``then`` or a user.

    Every method has torch's semantics (see ``torch.futures.Future``): a future completes
    once, with a value (``set_result``) or an exception (``set_exception``); callbacks added
    with ``then``/``add_done_callback`` run in the thread that completes it, or inline if it
    is already done.
    """

    def __init__(self, *, devices: list[Any] | None = None) -> None:
        if devices:
            raise ValueError("ringtorch futures hold CPU values only; `devices` must be empty")
        super().__init__()

    def wait(self) -> T:
        """Block until the future is done; return its value or raise its exception."""
        if not self.done():
            for hook in _before_blocking_wait:
                hook()
        return super().wait()

    def value(self) -> T:
        """The value of a completed future (raises its exception, if it has one).

        Raises:
            RuntimeError: the future is not done yet.
        """
        if not self.done():
            raise RuntimeError("Future.value() was called on a future that is not done yet; "
                               "call wait() (or use then()) instead")
        return super().value()

    def add_done_callback(self, callback: Callable[[Future[T]], None]) -> None:
        """Run ``callback(self)`` once the future is done (inline if it already is)."""
        # The RPC agent completes a future on the thread that reads replies unless user
        # callbacks are attached: those may block, so they run on a worker thread instead.
        self._has_callbacks = True
        super().add_done_callback(callback)

    def then(self, callback: Callable[[Future[T]], S]) -> Future[S]:
        """A new future completed with ``callback(self)`` once this one is done.

        If the callback raises, the new future holds a RuntimeError naming the original
        exception, as torch does.
        """
        child: Future[S] = Future()

        def run(fut: Future[T]) -> None:
            try:
                result = callback(fut)
            except BaseException as exc:
                child.set_exception(_callback_error(exc))
                return
            child.set_result(result)

        self.add_done_callback(run)
        return child

    def set_exception(self, result: BaseException) -> None:  # type: ignore[override]
        """Complete the future with an exception, raised by ``wait()`` and ``value()``.

        Raises:
            AssertionError: ``result`` is not an exception (torch's check and message).
        """
        if not isinstance(result, Exception):
            raise AssertionError(f"{result} is of type {type(result)}, not an Exception.")
        super().set_exception(result)


def collect_all(futures: list[Any]) -> Future[list[Any]]:
    """A future completed with the list of ``futures`` once all of them are done.

    As torch's (whose C++ ``collectAll`` does the same), the combined future completes with
    the first error as soon as one of the futures fails.
    """
    combined: Future[list[Any]] = Future()
    if not futures:
        combined.set_result([])
        return combined
    lock = threading.Lock()
    state = {"remaining": len(futures), "finished": False}

    def one_done(fut: Any) -> None:
        error: BaseException | None = None
        try:
            fut.value()
        except BaseException as exc:
            error = exc
        with lock:
            if state["finished"]:
                return
            state["remaining"] -= 1
            if error is None and state["remaining"]:
                return
            state["finished"] = True
        if error is not None:
            combined.set_exception(cast(Exception, error))
        else:
            combined.set_result(list(futures))

    for fut in futures:
        fut.add_done_callback(one_done)
    return combined


def wait_all(futures: list[Any]) -> list[Any]:
    """Wait for every future and return their values; raise the first error met."""
    return [fut.wait() for fut in collect_all(futures).wait()]


__all__ = ["Future", "collect_all", "register_blocking_wait_hook", "wait_all"]

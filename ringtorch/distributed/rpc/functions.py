"""``@async_execution``: an RPC function that returns a Future instead of a value.

The callee installs the reply as a callback on the returned Future, so the function returns
(and frees its worker thread) at once, and the reply leaves when the Future completes. The
marker attribute is torch's, so functions decorated with ``torch.distributed.rpc.functions.
async_execution`` work too. As in torch, combine it with ``@staticmethod``/``@classmethod``
as the inner decorator.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

ASYNC_MARKER = "_wrapped_async_rpc_function"


def async_execution(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` as returning a Future whose value is the RPC's result."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    setattr(wrapper, ASYNC_MARKER, fn)
    return wrapper


def is_async(fn: Any) -> bool:
    """Whether ``fn`` was decorated with ``async_execution`` (ours or torch's)."""
    return getattr(fn, ASYNC_MARKER, None) is not None


__all__ = ["async_execution"]

"""Errors of the RPC framework; each names the worker and, where there is one, the function.

They are RuntimeError subclasses (through ringtorch's torch-named family), as torch raises
RuntimeError for every RPC failure, so ``except RuntimeError`` keeps working. An exception
raised by the remote function itself is re-raised with its own type instead (see api.py).
"""

from __future__ import annotations

from ringtorch._errors import DistError, DistNetworkError


class RpcError(DistError):
    """Base of the errors the RPC framework itself raises."""


class RpcTimeoutError(RpcError, TimeoutError):
    """A call did not complete within its timeout; the message names function and worker.

    The message starts as torch's does ("RPC ran for more than set timeout") so that code
    matching torch's message keeps working.
    """


class RpcPeerDiedError(RpcError, DistNetworkError):
    """The destination worker died or closed its connection; the message names it.

    Calls are at most once: a call that fails this way may or may not have run remotely.
    """


class RpcProtocolError(RpcError, DistNetworkError):
    """A peer sent bytes that are not a valid RPC message; its connection is dropped."""


__all__ = ["RpcError", "RpcPeerDiedError", "RpcProtocolError", "RpcTimeoutError"]

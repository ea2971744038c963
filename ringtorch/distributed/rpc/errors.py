"""Errors of the RPC framework; each names the worker and, where there is one, the function.

They are RuntimeError subclasses (through ringtorch's torch-named family), as torch raises
RuntimeError for every RPC failure, so ``except RuntimeError`` keeps working. An exception
raised by the remote function itself is re-raised with its own type instead (see api.py).
"""

from __future__ import annotations

from ringtorch._errors import DistError, DistNetworkError
from ringtorch._wire.errors import PeerUnreachableError


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


class RpcPeerUnreachableError(RpcError, DistNetworkError):
    """The network to the destination worker's host failed (no acknowledgement within the TCP
    user timeout, or no route): the worker may still be running. The message names it, its
    host and the call. Calls are at most once, as for RpcPeerDiedError.
    """


class RpcProtocolError(RpcError, DistNetworkError):
    """A peer sent bytes that are not a valid RPC message; its connection is dropped."""


def lost_worker_error(worker: str, host: str, me: str, what: str, reason: BaseException,
                      call: object | None) -> RpcError:
    """The error of a call to ``worker`` (on ``host``; "" for this host) whose connection
    broke for ``reason``: RpcPeerUnreachableError when the network broke it, else
    RpcPeerDiedError (``what`` says how: "died or closed its connection")."""
    where = f" on host {host}" if host else ""
    tail = f"; call: {call}" if call is not None else ""
    if isinstance(reason, PeerUnreachableError):
        return RpcPeerUnreachableError(
            f"RPC to {worker}{where} failed: the worker is unreachable from {me}: "
            f"{reason.reason}; the network to its host failed or the host is down (the worker "
            f"may still be running){tail}")
    return RpcPeerDiedError(f"RPC to {worker}{where} failed: the worker {what} ({reason}){tail}")


__all__ = ["RpcError", "RpcPeerDiedError", "RpcPeerUnreachableError", "RpcProtocolError",
           "RpcTimeoutError",
           "lost_worker_error"]

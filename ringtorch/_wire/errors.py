"""Errors of the wire layer; each names the peer it is about.

They derive from the torch-named family in ``ringtorch._errors`` so that callers can catch
``DistNetworkError`` (or ``RuntimeError``) whatever layer the failure surfaced in.
"""

from __future__ import annotations

import errno

from ringtorch import _config
from ringtorch._errors import DistNetworkError

# errnos of a connection the network broke (the peer may be alive), with what each means
UNREACHABLE_ERRNOS = {
    errno.ETIMEDOUT: "no acknowledgement for {horizon_s:g} s (the TCP user timeout, "
                     "RINGTORCH_TCP_USER_TIMEOUT_MS)",
    errno.ENETUNREACH: "the network is unreachable (a link is down or there is no route)",
    errno.EHOSTUNREACH: "there is no route to the host",
    errno.ENETDOWN: "the network is down",
    errno.EHOSTDOWN: "the host is down",
}


class PeerClosedError(DistNetworkError):
    """The peer closed the connection or died (EOF or reset) while we were talking to it.

    ``peer`` is the peer's rank where the channel knows it (-1 otherwise)."""

    peer: int = -1


class PeerUnreachableError(PeerClosedError):
    """The network broke the connection: TCP gave up waiting for acknowledgements
    (TCP_USER_TIMEOUT, keepalive) or there is no route any more. The peer's process may be
    alive. ``reason`` says which, in words (UNREACHABLE_ERRNOS)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def unreachable(peer: str, what: str, exc: OSError) -> PeerUnreachableError | None:
    """The PeerUnreachableError for ``exc`` met while ``what`` (None: not a network errno)."""
    reason = UNREACHABLE_ERRNOS.get(exc.errno or 0)
    if reason is None:
        return None
    reason = reason.format(horizon_s=_config.TCP_USER_TIMEOUT_MS.get() / 1000)
    return PeerUnreachableError(f"connection to {peer} broke while {what}: {reason}", reason)


class HandshakeError(DistNetworkError):
    """The connection handshake failed: bad magic or version, a wrong or missing secret,
    an oversized message or a deadline passed. The connection is closed; nothing after the
    handshake was read."""


class DeadlineExceeded(DistNetworkError, TimeoutError):
    """A wire operation did not finish before its absolute deadline (time.monotonic())."""


__all__ = ["UNREACHABLE_ERRNOS", "DeadlineExceeded", "HandshakeError", "PeerClosedError",
           "PeerUnreachableError", "unreachable"]

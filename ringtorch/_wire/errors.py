"""Errors of the wire layer; each names the peer it is about.

They derive from the torch-named family in ``ringtorch._errors`` so that callers can catch
``DistNetworkError`` (or ``RuntimeError``) whatever layer the failure surfaced in.
"""

from __future__ import annotations

from ringtorch._errors import DistNetworkError


class PeerClosedError(DistNetworkError):
    """The peer closed the connection or died (EOF or reset) while we were talking to it."""


class HandshakeError(DistNetworkError):
    """The connection handshake failed: bad magic or version, a wrong or missing secret,
    an oversized message or a deadline passed. The connection is closed; nothing after the
    handshake was read."""


class DeadlineExceeded(DistNetworkError, TimeoutError):
    """A wire operation did not finish before its absolute deadline (time.monotonic())."""


__all__ = ["DeadlineExceeded", "HandshakeError", "PeerClosedError"]

"""Which socket errors mean "the network broke the connection", and the words for each.

A peer that is known dead (its connection was reset or closed: the process exited) and one
that is unreachable (TCP gave up: timeout, no route; the process may be alive) are reported
differently, and both are DistNetworkErrors (docs/design/failure-detection.md, G8).
"""

from __future__ import annotations

import errno

import pytest

from ringtorch._errors import DistBackendError, DistError, DistNetworkError, PeerLostError
from ringtorch._wire.errors import PeerClosedError, PeerUnreachableError, unreachable


@pytest.mark.parametrize(("code", "reason"), [
    (errno.ETIMEDOUT, "no acknowledgement for 10 s (the TCP user timeout, "
                      "RINGTORCH_TCP_USER_TIMEOUT_MS)"),
    (errno.ENETUNREACH, "the network is unreachable (a link is down or there is no route)"),
    (errno.EHOSTUNREACH, "there is no route to the host"),
    (errno.ENETDOWN, "the network is down"),
    (errno.EHOSTDOWN, "the host is down"),
])
def test_network_errnos_become_peer_unreachable_errors_saying_why(code, reason):
    error = unreachable("rank 3 (10.0.0.4)", "receiving", OSError(code, "kernel words"))
    assert isinstance(error, PeerUnreachableError)
    assert isinstance(error, PeerClosedError) and isinstance(error, DistNetworkError)
    assert error.reason == reason
    assert str(error) == f"connection to rank 3 (10.0.0.4) broke while receiving: {reason}"


def test_the_timeout_reason_gives_the_configured_horizon(monkeypatch):
    monkeypatch.setenv("RINGTORCH_TCP_USER_TIMEOUT_MS", "2500")
    error = unreachable("rank 1", "sending", TimeoutError(errno.ETIMEDOUT, "timed out"))
    assert error is not None
    assert error.reason.startswith("no acknowledgement for 2.5 s ")


@pytest.mark.parametrize("code", [errno.ECONNRESET, errno.EPIPE, errno.EBADF, errno.EAGAIN, None])
def test_other_errors_are_not_called_unreachable(code):
    assert unreachable("rank 1", "sending", OSError(code, "x")) is None


def test_a_lost_peer_is_caught_as_a_network_error_and_as_a_backend_error():
    assert issubclass(PeerLostError, DistNetworkError)
    assert issubclass(PeerLostError, DistBackendError)
    assert issubclass(PeerLostError, DistError) and issubclass(PeerLostError, RuntimeError)

"""Every TCP socket ringtorch opens notices a dead network in seconds, not TCP's 15 minutes.

Connected sockets (``connect_tcp``: mesh, RPC and store clients) and the sockets a listener
accepts (``listen_tcp``: mesh, RPC and store servers; accepted sockets inherit the listener's
options) carry keepalive and TCP_USER_TIMEOUT = RINGTORCH_TCP_USER_TIMEOUT_MS, with keepalive
probes every third of it, so a silent peer breaks the connection within about that horizon
(docs/design/failure-detection.md, G8).
"""

from __future__ import annotations

import socket
import time

import pytest

from ringtorch import _config
from ringtorch._wire.sockets import connect_tcp, listen_tcp


def _options(sock: socket.socket) -> dict[str, int]:
    def get(level: int, name: int) -> int:
        return sock.getsockopt(level, name)

    return {"keepalive": get(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "user_timeout_ms": get(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
            "idle_s": get(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "interval_s": get(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "probes": get(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "nodelay": get(socket.IPPROTO_TCP, socket.TCP_NODELAY)}


@pytest.mark.parametrize(("horizon_ms", "idle_s"), [(10_000, 3), (2_000, 1)])
def test_connected_and_accepted_tcp_sockets_carry_keepalive_and_the_user_timeout(
        monkeypatch, horizon_ms, idle_s):
    monkeypatch.setenv("RINGTORCH_TCP_USER_TIMEOUT_MS", str(horizon_ms))
    assert _config.TCP_USER_TIMEOUT_MS.get() == horizon_ms
    listener = listen_tcp("127.0.0.1", 0)
    try:
        client = connect_tcp("127.0.0.1", listener.getsockname()[1], time.monotonic() + 10)
        accepted, _ = listener.accept()
        want = {"keepalive": 1, "user_timeout_ms": horizon_ms, "idle_s": idle_s,
                "interval_s": idle_s, "probes": 3, "nodelay": 1}
        assert _options(client) == want
        assert _options(accepted) == want
        client.close()
        accepted.close()
    finally:
        listener.close()


def test_the_default_horizon_bounds_a_partition_under_15_seconds():
    # a silent idle connection: keepalive probes start after idle_s and the connection is
    # dropped once the user timeout has passed with probes unanswered (Linux's rule), at
    # the latest one probe interval after the horizon
    horizon_s = _config.TCP_USER_TIMEOUT_MS.default / 1000
    assert horizon_s + max(1, horizon_s // 3) < 15

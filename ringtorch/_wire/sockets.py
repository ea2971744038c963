"""TCP and Unix stream sockets: listen, connect with retry until a deadline, tune.

A connection retried because nobody accepts yet is reported while it waits (the caller says
how, e.g. a warning naming the address, the seconds waited and the last error) on the
schedule of :func:`next_report_s`: after 1 s, then each time the wait has doubled, then once
a minute, so that a server that never comes up is visible long before the deadline.

Every socket ringtorch opens goes through here, so every one gets the same treatment:
TCP_NODELAY (our frames are already batched; Nagle would add 40 ms to small replies),
keepalive with TCP_USER_TIMEOUT so that a dead or partitioned peer is noticed within
seconds instead of TCP's default fifteen minutes, and close-on-exec.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable

from ringtorch import _config
from ringtorch._wire.errors import DeadlineExceeded

# errnos that mean "the server is not there yet, try again" while connecting.
_RETRYABLE_CONNECT = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ENOENT,  # Unix socket path not created yet
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ETIMEDOUT,
    errno.EAGAIN,
}

# The "still connecting" schedule: the first report after FIRST_REPORT_S of waiting, the next
# ones when the wait has doubled, at most MAX_REPORT_INTERVAL_S apart.
FIRST_REPORT_S = 1.0
MAX_REPORT_INTERVAL_S = 60.0


def next_report_s(waited_s: float) -> float:
    """The wait (seconds since the first try) at which the next report is due, once
    ``waited_s`` seconds have passed: the first of 1, 2, 4, ..., 32, 64, 124, 184, ...
    (doubling, then every minute) that is later than ``waited_s``."""
    at = FIRST_REPORT_S
    while at <= waited_s:
        at += min(at, MAX_REPORT_INTERVAL_S)
    return at


def tune_tcp(sock: socket.socket) -> None:
    """NODELAY, keepalive and TCP_USER_TIMEOUT on a connected or listening TCP socket."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    horizon_ms = _config.TCP_USER_TIMEOUT_MS.get()
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, horizon_ms)
    if hasattr(socket, "TCP_KEEPIDLE"):
        idle_s = max(1, horizon_ms // 3000)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, idle_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, idle_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


def _family_for(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def listen_tcp(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A listening TCP socket on host:port; port 0 picks a free port (read it back with
    ``sock.getsockname()[1]``).

    Raises:
        OSError: the address cannot be bound; for a port already in use the message says
            ``"port {port} on {host} is already in use"`` and what to do.
    """
    bind_host = host or "0.0.0.0"
    if bind_host not in ("", "0.0.0.0", "::"):
        try:
            infos = socket.getaddrinfo(bind_host, port, type=socket.SOCK_STREAM)
            family, _, _, _, address = infos[0]
        except socket.gaierror as exc:
            raise OSError(f"cannot resolve host {host!r} to listen on: {exc}") from exc
    else:
        family, address = _family_for(bind_host), (bind_host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise OSError(
                errno.EADDRINUSE,
                f"port {port} on {bind_host} is already in use; stop the process that holds it "
                f"or choose another port (port 0 picks a free one)",
            ) from exc
        raise OSError(exc.errno, f"cannot listen on {bind_host}:{port}: {exc.strerror}") from exc
    sock.listen(backlog)
    tune_tcp(sock)
    return sock


def connect_tcp(host: str, port: int, deadline: float, retry: bool = True,
                report: Callable[[float, OSError], None] | None = None) -> socket.socket:
    """Connect to host:port, retrying while the server is not up yet, until ``deadline``.

    ``report(waited_s, last_error)`` is called while retrying, when :func:`next_report_s`
    says a report is due.

    Raises:
        DeadlineExceeded: nobody accepted before the deadline; the message names host:port
            and the last error seen.
        OSError: a non-retryable error (bad address), or any error when ``retry`` is False.
    """
    delay = 0.01
    last_error: OSError | None = None
    started = time.monotonic()
    report_at = next_report_s(0.0)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DeadlineExceeded(
                f"could not connect to {host}:{port}: no server accepted the connection in "
                f"{time.monotonic() - started:.1f} s (last error: {last_error}); check that the "
                f"master address and port are right and that the server process is running"
            )
        try:
            sock = socket.create_connection((host, port), timeout=min(remaining, 10.0))
        except socket.gaierror as exc:
            raise OSError(f"cannot resolve host {host!r}: {exc}") from exc
        except OSError as exc:
            if not retry or (exc.errno not in _RETRYABLE_CONNECT and not isinstance(
                    exc, (TimeoutError, ConnectionError))):
                raise
            last_error = exc
            waited = time.monotonic() - started
            if report is not None and waited >= report_at:
                report(waited, exc)
                report_at = next_report_s(waited)
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 0.5)
            continue
        sock.settimeout(None)
        tune_tcp(sock)
        return sock


def listen_unix(path: str, backlog: int = 1024) -> socket.socket:
    """A listening Unix stream socket; ``path`` may start with NUL for the abstract namespace."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on Unix socket {path!r}: {exc.strerror}") from exc
    sock.listen(backlog)
    return sock


def connect_unix(path: str, deadline: float) -> socket.socket:
    """Connect to a Unix stream socket, retrying until it exists or ``deadline`` passes.

    Raises:
        DeadlineExceeded: nobody accepted before the deadline; the message names the path.
    """
    delay = 0.005
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno not in _RETRYABLE_CONNECT:
                raise
            if time.monotonic() >= deadline:
                raise DeadlineExceeded(
                    f"could not connect to Unix socket {path!r} in time (last error: {exc})"
                ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0, read it, close).

    Another process can take it in between; servers should prefer binding port 0 themselves.
    """
    with socket.socket(_family_for(host), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


__all__ = [
    "connect_tcp",
    "next_report_s",
    "connect_unix",
    "free_port",
    "listen_tcp",
    "listen_unix",
    "tune_tcp",
]

"""What a TCPStore client says when it cannot reach its server yet, or its connection breaks.

The rule it keeps: the words say which of three things happened, because each asks for a
different remedy: the server process is gone (the connection was reset or closed: the master,
rank 0, exited or crashed), the network to the server's host failed (TCP's user timeout or no
route: the server may still run), or the server is connected but does not answer (hung).
Every message names the server's host:port.
"""

from __future__ import annotations

from datetime import timedelta

from ringtorch._errors import DistError, DistNetworkError, DistStoreError
from ringtorch._wire.errors import unreachable


def request_failed(host: str, port: int, exc: OSError, wait_s: float) -> tuple[DistError,
                                                                               str | None]:
    """The error of a request whose connection broke with ``exc`` after waiting up to
    ``wait_s`` seconds, and why the connection is lost (None: it is not, the server is slow:
    the client may reconnect for the whole store timeout)."""
    where = f"TCPStore {host}:{port}"
    cut = unreachable(where, "waiting for its answer", exc)
    if cut is not None:  # the network broke it: TCP's user timeout (with an errno), no route
        lost = f"{where} is unreachable: {cut.reason}"
        return DistNetworkError(f"{lost}; the network to the store's host failed or that host "
                                f"is down (the server, on rank 0, may still be running)"), lost
    if isinstance(exc, (BlockingIOError, TimeoutError)):
        return DistStoreError(f"{where} did not answer within {timedelta(seconds=wait_s)}: the "
                              f"server is hung or unreachable"), None
    return DistNetworkError(f"lost the connection to {where} ({exc}); did the server process "
                            f"(the master, rank 0) exit or crash?"), str(exc)


def still_connecting(peer: str, waited_s: float, exc: OSError, timeout: timedelta) -> str:
    """The warning of a client still waiting for the server at ``peer`` to accept it."""
    return (f"TCPStore client: still connecting to {peer}, {waited_s:.1f} s so far (last "
            f"error: {exc}); retrying until the timeout ({timeout}): is the master (rank 0) "
            f"running, and are MASTER_ADDR and MASTER_PORT right?")


def reconnect_failed(host: str, port: int, lost: str, seconds: float) -> DistNetworkError:
    """The error when connecting again within ``seconds`` failed after the connection was
    lost for ``lost`` (request_failed's reason)."""
    gone = ("the network to the store's host is still cut" if " is unreachable: " in lost else
            "the server process (the master, rank 0) exited or crashed")
    return DistNetworkError(f"lost the connection to TCPStore {host}:{port} ({lost}) and could "
                            f"not connect again within {seconds:g} s: {gone}")


__all__ = ["reconnect_failed", "request_failed", "still_connecting"]

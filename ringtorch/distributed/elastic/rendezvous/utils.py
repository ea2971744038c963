"""``torch.distributed.elastic.rendezvous.utils``: parsing a rendezvous endpoint, with torch's
rules and messages."""

from __future__ import annotations

import re

_HOST = re.compile(r"^[\w.:-]+$")
_PORT = re.compile(r"^[0-9]{1,5}$")


def parse_rendezvous_endpoint(endpoint: str | None, default_port: int) -> tuple[str, int]:
    """``"host:port"``, ``"host"``, ``"[v6]:port"`` or ``"[v6]"`` -> (host, port); an empty
    endpoint is ``("localhost", default_port)``.

    Raises:
        ValueError: the port is not an integer below 65536, or the host is not a host name or
            an address.
    """
    endpoint = (endpoint or "").strip()
    if not endpoint:
        return "localhost", default_port
    if endpoint.startswith("[") and endpoint.endswith("]"):
        host, port_text = endpoint, None
    else:
        host, sep, port_text = endpoint.rpartition(":")
        if not sep:
            host, port_text = endpoint, None
    if len(host) > 1 and host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = default_port
    if port_text is not None:
        if not _PORT.match(port_text) or int(port_text) >= 2 ** 16:
            raise ValueError(f"The port number of the rendezvous endpoint '{endpoint}' must be "
                             f"an integer between 0 and 65536.")
        port = int(port_text)
    if not _HOST.match(host):
        raise ValueError(f"The hostname of the rendezvous endpoint '{endpoint}' must be a "
                         f"dot-separated list of labels, an IPv4 address, or an IPv6 address.")
    return host, port


__all__ = ["parse_rendezvous_endpoint"]

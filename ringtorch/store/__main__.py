"""A standalone TCPStore server: ``python -m ringtorch.store --port P [--host H]``.

For multi-node jobs whose store should outlive any one rank: start it on a reachable host,
point every rank at it (``TCPStore(host, P, is_master=False)``, or ``MASTER_ADDR``/``MASTER_PORT``
with ``TORCHELASTIC_USE_AGENT_STORE=True`` for ``env://``). It prints the address it listens on
and serves until SIGINT or SIGTERM. Set RINGTORCH_SECRET to require the job secret.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from ringtorch._wire.handshake import job_secret
from ringtorch.store._tcp_master import bind_address
from ringtorch.store._tcp_server import StoreServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ringtorch.store",
                                     description="Run a standalone ringtorch TCPStore server.")
    parser.add_argument("--port", type=int, required=True,
                        help="port to listen on (0 picks a free one; the address is printed)")
    parser.add_argument("--host", default="0.0.0.0",
                        help="address to listen on (default 0.0.0.0: every interface; a "
                             "loopback name keeps the store on this host)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if not 0 <= args.port < 65536:
        parser.error(f"--port must be from 0 to 65535, not {args.port}")
    host = args.host if args.host in ("0.0.0.0", "::") else bind_address(args.host)
    try:
        server = StoreServer(host, args.port)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if host in ("0.0.0.0", "::") and job_secret() is None:
        logging.warning("the store listens on every interface WITHOUT a job secret: anyone "
                        "who can reach port %d can read and write it; set RINGTORCH_SECRET",
                        server.port)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    print(f"ringtorch store listening on {host}:{server.port}", flush=True)
    stop.wait()
    server.close()
    print("ringtorch store stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

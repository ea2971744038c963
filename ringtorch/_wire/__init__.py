"""Bytes between processes: sockets, framing, the handshake. Never imports torch."""

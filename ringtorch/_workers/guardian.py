"""A guardian process that outlives a SIGKILLed supervisor just long enough to kill its job.

The parent-death signal kills the workers when the launcher dies, but not the workers' own
children (a data loader, a shell pipeline). The guardian is forked from the launcher before it
opens anything; the launcher tells it, through a pipe, each process group it starts and each
one it has finished stopping. When the pipe reaches EOF (the launcher exited, however it
died), the guardian SIGKILLs the groups still on its list and exits. It ignores the terminal's
signals, holds no other file descriptor, and runs only ``os`` calls.

Pipe messages are ASCII lines: ``+PGID`` (watch this group), ``-PGID`` (it is gone).
"""

from __future__ import annotations

import os
import signal

_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _guard(read_fd: int) -> None:
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    watched: set[int] = set()
    pending = b""
    while True:
        try:
            chunk = os.read(read_fd, 4096)
        except InterruptedError:
            continue
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line[:1] == b"+":
                watched.add(int(line[1:]))
            elif line[:1] == b"-":
                watched.discard(int(line[1:]))
    for pgid in watched:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass


class Guardian:
    """The launcher's handle on its guardian process. Create it before opening anything else."""

    def __init__(self) -> None:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the guardian: keep only the read end, then guard
            try:
                os.closerange(3, read_fd)
                os.closerange(read_fd + 1, 65536)
                _guard(read_fd)
            finally:
                os._exit(0)
        os.close(read_fd)
        self.pid = pid
        self._write_fd: int | None = write_fd
        os.set_inheritable(write_fd, False)

    def _send(self, line: str) -> None:
        if self._write_fd is not None:
            os.write(self._write_fd, line.encode() + b"\n")

    def watch(self, pgid: int) -> None:
        """Kill group ``pgid`` if the launcher dies before calling :meth:`release`."""
        self._send(f"+{pgid}")

    def release(self, pgid: int) -> None:
        """Group ``pgid`` is gone; forget it (its number may be reused)."""
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Let the guardian exit (every group it still watches is killed) and reap it."""
        if self._write_fd is None:
            return
        os.close(self._write_fd)
        self._write_fd = None
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


__all__ = ["Guardian"]

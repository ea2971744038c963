"""Where a worker's stdout and stderr go: the console, a log file, both, with rank prefixes.

Four routes, chosen per worker and stream (``route_stream``):

    console, no prefix, no file   the worker inherits the supervisor's stream (no copy at all)
    file only (--redirects)       the worker writes straight into its log file
    console with a prefix (--tee) a pipe, and one thread that copies each line to the log file
                                  (when there is one) and to the console as b"[rank3]:" + line
    nowhere (filtered rank)       /dev/null

A line reaches the console whole: every copying thread writes under one lock, so lines of
different workers never interleave inside a line. A last line without a newline gets one.
"""

from __future__ import annotations

import os
import subprocess
import threading
from typing import IO, Any

_CONSOLE_LOCK = threading.Lock()
_CHUNK_NBYTES = 65536


class LineCopier:
    """Copies one worker stream from a pipe to the console (prefixed) and a log file."""

    def __init__(self, console: IO[bytes], prefix: bytes, log_path: str | None) -> None:
        self._console = console
        self._prefix = prefix
        self._log = open(log_path, "wb") if log_path else None
        self._thread: threading.Thread | None = None

    def start(self, pipe: IO[bytes], name: str) -> None:
        """Start copying from ``pipe`` (the read end) until it reaches EOF."""
        self._thread = threading.Thread(target=self._run, args=(pipe,), name=name, daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for EOF on the pipe; True when the copier has finished."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self, pipe: IO[bytes]) -> None:
        pending = b""
        fd = pipe.fileno()
        try:
            while True:
                chunk = os.read(fd, _CHUNK_NBYTES)
                if not chunk:
                    break
                if self._log is not None:
                    self._log.write(chunk)
                    self._log.flush()
                pending += chunk
                cut = pending.rfind(b"\n") + 1
                if cut:
                    self._emit(pending[:cut])
                    pending = pending[cut:]
            if pending:
                self._emit(pending + b"\n")
        except OSError:
            pass  # the console went away (closed pipe): nothing left to copy to
        finally:
            pipe.close()
            if self._log is not None:
                self._log.close()

    def _emit(self, lines: bytes) -> None:
        # ``lines`` ends with b"\n"; split on b"\n" only, so a b"\r" progress bar stays one line.
        text = b"".join(self._prefix + line + b"\n" for line in lines[:-1].split(b"\n"))
        with _CONSOLE_LOCK:
            self._console.write(text)
            self._console.flush()


def route_stream(console: IO[bytes], prefix: bytes | None, log_path: str | None,
                 show: bool) -> tuple[Any, LineCopier | None]:
    """Decide where one worker stream goes.

    Args:
        console: the supervisor's binary stream (``sys.stdout.buffer``) for this stream.
        prefix: bytes put before each console line (``b"[rank0]:"``), or None for no copy
            thread: the worker writes to the console or the file directly.
        log_path: a log file for this stream, or None.
        show: whether this stream appears on the console at all.

    Returns:
        ``(stdout_or_stderr_argument_for_Popen, copier_to_start_on_the_pipe_or_None)``; a
        file object in the first position must be closed by the caller once the worker runs.
    """
    if show and (prefix is not None):
        return subprocess.PIPE, LineCopier(console, prefix, log_path)
    if show and log_path is None:
        return None, None
    if show:  # console and file without a prefix: still needs a copier
        return subprocess.PIPE, LineCopier(console, b"", log_path)
    if log_path is not None:
        return open(log_path, "wb"), None
    return subprocess.DEVNULL, None


__all__ = ["LineCopier", "route_stream"]

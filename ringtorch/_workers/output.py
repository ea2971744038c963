"""Where a worker's stdout and stderr go: the console, a log file, both, with line prefixes.

Four routes, chosen per worker and stream (``route_stream``):

    console (with or without a prefix, a pipe, and one thread that copies the stream a whole
    and with or without a file)         line at a time to the console, each line behind
                                        the prefix (--tee: b"[default0]:"), and every byte
                                        as written to the log file (when there is one)
    file only (--redirects)             the worker writes straight into its log file
    nowhere (filtered rank)             /dev/null

The rule kept: lines of different workers never mix on the console. Every copier writes whole
lines under one lock (``_CONSOLE``), and so do the launcher's own messages
(``console_write``). A line still without its newline PARTIAL_LINE_S after its first byte
came, once the pipe is empty (a prompt before ``input()``, a progress bar redrawn with
``\\r``), or longer than one read (64 KiB), is written as it is, so that it shows; more of
the same line continues it in place, unless another worker wrote in between: then the open
line is ended with a newline first, and the rest of it starts a new line behind its prefix.
A worker's last line without a newline gets one when its stream ends.
"""

from __future__ import annotations

import os
import select
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

# How long a line without its newline is held back before it is shown as it is: long enough
# that a worker's line written in pieces (print(a, b) under ``python -u`` makes one write per
# piece) is still whole, short enough for a prompt or a progress bar to show at once.
PARTIAL_LINE_S = 0.5
_CHUNK_NBYTES = 65536


@dataclass
class _Console:
    """The one state of this module: who writes to the console, and whose line is open."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    open_by: object | None = None  # the writer whose last line is on the console unfinished
    open_on: IO[bytes] | None = None  # the stream that line is on


_CONSOLE = _Console()


def frame_lines(data: bytes, prefix: bytes, continuing: bool) -> bytes:
    """What goes to the console for ``data``, bytes of one stream: each line behind
    ``prefix``, but the first when ``continuing`` an open line. ``data`` ends with
    b"\\n" (whole lines) or not (its last line is partial and stays without a newline).
    Lines are cut at b"\\n" only: a progress bar's b"\\r" stays inside its line."""
    pieces = data.split(b"\n")
    out = [piece if (i == 0 and continuing) else prefix + piece
           for i, piece in enumerate(pieces[:-1])]
    if pieces[-1]:
        out.append(pieces[-1] if (len(pieces) == 1 and continuing) else prefix + pieces[-1])
        return b"\n".join(out)
    return b"".join(line + b"\n" for line in out)


def _write(writer: object, stream: IO[bytes], data: bytes, complete: bool) -> None:
    """Write under the console lock; ``data`` was framed for ``writer``'s open line."""
    if _CONSOLE.open_by is not None and _CONSOLE.open_by is not writer:
        assert _CONSOLE.open_on is not None
        _CONSOLE.open_on.write(b"\n")
        _CONSOLE.open_on.flush()
    stream.write(data)
    stream.flush()
    _CONSOLE.open_by, _CONSOLE.open_on = (None, None) if complete else (writer, stream)


def console_write(stream: IO[str], text: str) -> None:
    """Write ``text`` (whole lines) to a text console stream, never inside a worker's line."""
    with _CONSOLE.lock:
        if _CONSOLE.open_by is not None:
            assert _CONSOLE.open_on is not None
            _CONSOLE.open_on.write(b"\n")
            _CONSOLE.open_on.flush()
            _CONSOLE.open_by = _CONSOLE.open_on = None
        stream.write(text)
        stream.flush()


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
        pending, held_since = b"", 0.0  # the line still without its newline, since when
        fd = pipe.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        try:
            while True:
                if pending:
                    # Bytes already in the pipe come first: the held line may end there (the
                    # copier itself may have been slow, e.g. blocked on a full console).
                    wait_s = max(0.0, held_since + PARTIAL_LINE_S - time.monotonic())
                    if len(pending) >= _CHUNK_NBYTES or not poller.poll(wait_s * 1000):
                        self._emit(pending, complete=False)
                        pending = b""
                        continue
                chunk = os.read(fd, _CHUNK_NBYTES)
                if not chunk:
                    break
                if self._log is not None:
                    self._log.write(chunk)
                    self._log.flush()
                if not pending:
                    held_since = time.monotonic()
                pending += chunk
                cut = pending.rfind(b"\n") + 1
                if cut:
                    self._emit(pending[:cut], complete=True)
                    pending, held_since = pending[cut:], time.monotonic()
            self._emit(pending + b"\n" if pending else b"", complete=True)
        except OSError:
            pass  # the console went away (closed pipe): nothing left to copy to
        finally:
            pipe.close()
            if self._log is not None:
                self._log.close()

    def _emit(self, data: bytes, complete: bool) -> None:
        with _CONSOLE.lock:
            continuing = _CONSOLE.open_by is self
            if not data:  # the stream ended: end its open line, if any
                if continuing:
                    _write(self, self._console, b"\n", complete=True)
                return
            _write(self, self._console, frame_lines(data, self._prefix, continuing), complete)


def route_stream(console: IO[bytes], prefix: bytes | None, log_path: str | None,
                 show: bool) -> tuple[Any, LineCopier | None]:
    """Decide where one worker stream goes.

    Args:
        console: the supervisor's binary stream (``sys.stdout.buffer``) for this stream.
        prefix: bytes put before each console line (``b"[default0]:"``), or None for none.
        log_path: a log file for this stream, or None.
        show: whether this stream appears on the console at all.

    Returns:
        ``(stdout_or_stderr_argument_for_Popen, copier_to_start_on_the_pipe_or_None)``; a
        file object in the first position must be closed by the caller once the worker runs.
    """
    if show:
        return subprocess.PIPE, LineCopier(console, prefix or b"", log_path)
    if log_path is not None:
        return open(log_path, "wb"), None
    return subprocess.DEVNULL, None


__all__ = ["PARTIAL_LINE_S", "LineCopier", "console_write", "frame_lines", "route_stream"]

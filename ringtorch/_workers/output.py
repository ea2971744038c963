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
Open lines are kept per destination (a terminal, a file), so stdout and stderr sent to two
files never break each other's lines. A worker's stdout and stderr sent to one destination are
one writer, as on the worker's own terminal: what one stream holds back is shown before the
other's next bytes, which may continue its line (tqdm's bar on stderr, then a line on stdout
that overwrites it). A worker's last line without a newline gets one when its stream ends.
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
    # per destination (_destination): the copier whose last line there is unfinished
    open_by: dict[object, LineCopier] = field(default_factory=dict)
    copiers: list[LineCopier] = field(default_factory=list)  # those copying now


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


def _destination(stream: IO[Any]) -> object:
    """What names the file a console stream writes to: stdout and stderr on one terminal (or
    sent to one file) are one destination, and a line open there is open for both."""
    try:
        stat = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return id(stream)
    return (stat.st_dev, stat.st_ino)


def _end_open_line(destination: object) -> None:
    """End the line open on ``destination`` with a newline (under the console lock)."""
    opener = _CONSOLE.open_by.pop(destination, None)
    if opener is not None:
        opener._console.write(b"\n")
        opener._console.flush()


def console_write(stream: IO[str], text: str) -> None:
    """Write ``text`` (whole lines) to a text console stream, never inside a worker's line."""
    with _CONSOLE.lock:
        _end_open_line(_destination(stream))
        stream.write(text)
        stream.flush()


class LineCopier:
    """Copies one worker stream from a pipe to the console (prefixed) and a log file.

    ``worker``: the same key for the copiers of one worker's stdout and stderr. Where both go
    to one destination (a terminal) they are one writer, as the worker would be writing there
    itself: one stream's line may continue the other's open line (a progress bar on stderr
    cleared by ``\\r``, then a line on stdout), and what one holds back is shown before the
    other's next bytes.
    """

    def __init__(self, console: IO[bytes], prefix: bytes, log_path: str | None,
                 worker: object = None) -> None:
        self._console = console
        self._prefix = prefix
        self._log = open(log_path, "wb") if log_path else None
        self._worker = self if worker is None else worker
        self._destination = _destination(console)
        self._held = b""  # the start of a line not shown yet (under the console lock)
        self._thread: threading.Thread | None = None

    def start(self, pipe: IO[bytes], name: str) -> None:
        """Start copying from ``pipe`` (the read end) until it reaches EOF."""
        with _CONSOLE.lock:
            _CONSOLE.copiers.append(self)
        self._thread = threading.Thread(target=self._run, args=(pipe,), name=name, daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for EOF on the pipe; True when the copier has finished."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self, pipe: IO[bytes]) -> None:
        held_since: float | None = None  # when the first byte of the held line came
        fd = pipe.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        try:
            while True:
                if held_since is not None:
                    # Bytes already in the pipe come first: the held line may end there (the
                    # copier itself may have been slow, e.g. blocked on a full console).
                    wait_s = max(0.0, held_since + PARTIAL_LINE_S - time.monotonic())
                    if len(self._held) >= _CHUNK_NBYTES or not poller.poll(wait_s * 1000):
                        with _CONSOLE.lock:
                            self._show_held()
                        held_since = None
                        continue
                chunk = os.read(fd, _CHUNK_NBYTES)
                if not chunk:
                    break
                if self._log is not None:
                    self._log.write(chunk)
                    self._log.flush()
                with _CONSOLE.lock:
                    cut = self._take(chunk)
                    if not self._held:
                        held_since = None
                    elif cut or held_since is None:
                        held_since = time.monotonic()
            with _CONSOLE.lock:
                if self._held:
                    self._show(self._held + b"\n", complete=True)
                    self._held = b""
                elif _CONSOLE.open_by.get(self._destination) is self:
                    _end_open_line(self._destination)
        except OSError:
            pass  # the console went away (closed pipe): nothing left to copy to
        finally:
            with _CONSOLE.lock:
                _CONSOLE.copiers.remove(self)
            pipe.close()
            if self._log is not None:
                self._log.close()

    def _take(self, chunk: bytes) -> bool:
        """Show the whole lines ``chunk`` completes and hold the rest; whether a line ended."""
        data = self._held + chunk
        cut = data.rfind(b"\n") + 1
        self._held = data[cut:]
        if cut:
            self._show(data[:cut], complete=True)
        return bool(cut)

    def _show_held(self, siblings: bool = True) -> None:
        if self._held:
            held, self._held = self._held, b""
            self._show(held, complete=False, siblings=siblings)

    def _show(self, data: bytes, complete: bool, siblings: bool = True) -> None:
        """Write ``data`` (framed here) to the console, under the console lock."""
        here = self._destination
        if siblings:  # what this worker's other stream there holds back was written before
            for other in _CONSOLE.copiers:
                if (other is not self and other._worker is self._worker
                        and other._destination == here):
                    other._show_held(siblings=False)
        opener = _CONSOLE.open_by.get(here)
        if opener is not None and opener._worker is not self._worker:
            _end_open_line(here)
        continuing = here in _CONSOLE.open_by
        self._console.write(frame_lines(data, self._prefix, continuing))
        self._console.flush()
        if complete:
            _CONSOLE.open_by.pop(here, None)
        else:
            _CONSOLE.open_by[here] = self


def route_stream(console: IO[bytes], prefix: bytes | None, log_path: str | None,
                 show: bool, worker: object = None) -> tuple[Any, LineCopier | None]:
    """Decide where one worker stream goes.

    Args:
        console: the supervisor's binary stream (``sys.stdout.buffer``) for this stream.
        prefix: bytes put before each console line (``b"[default0]:"``), or None for none.
        log_path: a log file for this stream, or None.
        show: whether this stream appears on the console at all.
        worker: a key shared by the copiers of one worker's streams (see LineCopier).

    Returns:
        ``(stdout_or_stderr_argument_for_Popen, copier_to_start_on_the_pipe_or_None)``; a
        file object in the first position must be closed by the caller once the worker runs.
    """
    if show:
        return subprocess.PIPE, LineCopier(console, prefix or b"", log_path, worker)
    if log_path is not None:
        return open(log_path, "wb"), None
    return subprocess.DEVNULL, None


__all__ = ["PARTIAL_LINE_S", "LineCopier", "console_write", "frame_lines", "route_stream"]

"""Stacks of a process that cannot answer: SIGUSR1 to a rank registered with faulthandler.

Each rank (hang_ask.py) registers ``faulthandler`` on SIGUSR1 with a stacks file whose first
line (``stacks_header``) says who writes there; an asker on the same host sends the signal
and reads what was appended. The rule this module keeps: never signal a process that did not
register (the default action of SIGUSR1 kills it), and never wait on one that cannot run its
handler (a stopped process); every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

SIGNAL = signal.SIGUSR1
SIGNAL_WAIT_S = 1.0  # how long an asker waits for the stacks of the silent ranks it signalled


def stacks_header(rank: int, info: dict[str, Any]) -> str:
    """The first line of a stacks file: who writes there (ringrun reads it to know which
    worker it may signal)."""
    return (f"# ringtorch stacks: rank {rank} pid {info['pid']} host {info['host']} "
            f"main {info['main_thread']}\n")


def parse_header(line: str) -> dict[str, Any] | None:
    """The header's fields, or None for a line that is not one."""
    words = line.split()
    if words[:3] != ["#", "ringtorch", "stacks:"] or len(words) < 11:
        return None
    try:
        return {"rank": int(words[4]), "pid": int(words[6]), "host": words[8],
                "main_thread": words[10]}
    except ValueError:
        return None


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, or a debugger's stop): it runs no
    signal handler until it is resumed, so asking it for stacks is pointless."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


def signal_all(targets: dict[int, tuple[int, str]], wait_s: float = SIGNAL_WAIT_S,
               ) -> dict[int, str | None]:
    """Send SIGUSR1 to each of ``targets`` (rank -> (pid, stacks file registered with
    faulthandler)) at once and return the stacks each appended there within ``wait_s``
    ("" if none came; None for a stopped process, which is not signalled)."""
    out: dict[int, str | None] = {}
    sizes: dict[int, tuple[str, int]] = {}
    for rank, (pid, path) in targets.items():
        if is_stopped(pid):
            out[rank] = None
            continue
        try:
            start = os.path.getsize(path)
            with open(path) as f:
                if parse_header(f.readline()) is None:
                    out[rank] = ""  # not a stacks file: the signal could kill the process
                    continue
            os.kill(pid, SIGNAL)
        except OSError:
            out[rank] = ""
            continue
        sizes[rank] = (path, start)
    deadline, seen = time.monotonic() + wait_s, dict.fromkeys(sizes, -1)
    waiting = set(sizes)
    while waiting and time.monotonic() < deadline:
        time.sleep(0.05)  # polling files other processes write from a signal handler
        for rank in list(waiting):
            path, start = sizes[rank]
            now = os.path.getsize(path)
            if now > start and now == seen[rank]:
                waiting.discard(rank)
            seen[rank] = now
    for rank, (path, start) in sizes.items():
        with open(path) as f:
            f.seek(start)
            out[rank] = f.read()
    return out


def signal_stacks(pid: int, path: str, wait_s: float = SIGNAL_WAIT_S) -> str:
    """Send SIGUSR1 to ``pid`` (registered with faulthandler on ``path``) and return the
    stacks it appends there; "" if nothing came within ``wait_s`` (or it is stopped)."""
    return signal_all({0: (pid, path)}, wait_s).get(0) or ""


__all__ = ["SIGNAL", "SIGNAL_WAIT_S", "is_stopped", "parse_header", "signal_all",
           "signal_stacks", "stacks_header"]

"""The launcher's own lines (``ringrun: ...``) on its stderr.

A leaf of the launcher: every part of it that speaks to the user imports :func:`say` from
here, so nothing imports the agent only to print. The line goes out whole, under the same
console lock as the workers' copied output (``ringtorch._workers.output``), so it never
lands inside a worker's line.
"""

from __future__ import annotations

import sys

from ringtorch._workers import console_write


def say(message: str) -> None:
    """One line from the launcher itself, on stderr."""
    console_write(sys.stderr, f"ringrun: {message}\n")


__all__ = ["say"]

"""The launcher's own lines (``ringrun: ...``) on its stderr.

A leaf of the launcher: every part of it that speaks to the user imports :func:`say` from
here, so nothing imports the agent only to print.
"""

from __future__ import annotations

import sys


def say(message: str) -> None:
    """One line from the launcher itself, on stderr."""
    print(f"ringrun: {message}", file=sys.stderr, flush=True)


__all__ = ["say"]

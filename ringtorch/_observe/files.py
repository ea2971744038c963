"""How a rank or the launcher writes what it observed: JSON files that a reader (another
process, the launcher merging them) never sees half written."""

from __future__ import annotations

import json
import os
import threading
from typing import Any


def write_json(data: Any, path: str | os.PathLike[str]) -> None:
    """Write ``data`` as compact JSON at ``path``: to a temporary name of this process and
    thread first (a flushing thread and the exit hook may write the same file), then renamed
    over it. ``json.dumps`` then one write: ``json.dump`` to a file does not use the C
    encoder, which made large traces several times slower to write."""
    target = os.fspath(path)
    tmp = f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"
    text = json.dumps(data, separators=(",", ":"))
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, target)


__all__ = ["write_json"]

"""The backend door: torch.distributed's backend "ringtorch", run on ringtorch's engine.

Installing ringtorch registers the name through torch's backend autoload (``autoload.py``,
cheap: it imports nothing of the engine); ``init_process_group("ringtorch")`` then creates
a ``RingtorchGroup`` (``group.py``), a ``torch.distributed.ProcessGroup`` whose every
operation runs on a ``ringtorch.collectives.ProcessGroup`` that met its peers through torch's
own store (``torch_store.py``). This package imports nothing at import time.
"""

from __future__ import annotations

from typing import Any

_LAZY = {"shrink_group", "SHRINK_DEFAULT", "SHRINK_ABORT"}


def __getattr__(name: str) -> Any:
    """``shrink_group`` (and its flags), imported on first use: see ``shrink.py``."""
    if name in _LAZY:
        from ringtorch.c10d import shrink

        return getattr(shrink, name)
    raise AttributeError(f"module 'ringtorch.c10d' has no attribute {name!r}")


__all__ = ["SHRINK_ABORT", "SHRINK_DEFAULT", "shrink_group"]

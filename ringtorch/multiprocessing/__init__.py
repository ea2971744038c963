"""``torch.multiprocessing``'s surface: the standard library's multiprocessing plus ``spawn``.

``import ringtorch.multiprocessing as mp`` gives everything ``multiprocessing`` has, plus
:func:`spawn`, :func:`start_processes` and their exceptions (spawn.py). The tensor sharing
strategy functions belong to torch and are forwarded to ``torch.multiprocessing`` on first use,
so importing this package does not import torch.
"""

from __future__ import annotations

import multiprocessing
from multiprocessing import *  # noqa: F403
from typing import Any

from ringtorch.multiprocessing.spawn import (
    ENV_VAR_PARALLEL_START,
    ProcessContext,
    ProcessException,
    ProcessExitedException,
    ProcessRaisedException,
    SpawnContext,
    spawn,
    start_processes,
)

_FROM_TORCH = ("set_sharing_strategy", "get_sharing_strategy", "get_all_sharing_strategies")


def __getattr__(name: str) -> Any:
    if name in _FROM_TORCH:
        import torch.multiprocessing

        return getattr(torch.multiprocessing, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    *_FROM_TORCH,
    *multiprocessing.__all__,
    "ENV_VAR_PARALLEL_START",
    "ProcessContext",
    "ProcessException",
    "ProcessExitedException",
    "ProcessRaisedException",
    "SpawnContext",
    "spawn",
    "start_processes",
]

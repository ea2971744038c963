"""Rank-side code of tests/integration/test_all_reduce_views.py: all_reduces of one buffer
again and again, of a shorter tensor at the same address, and of a negated view of it (the
backend reuses its view of a buffer's bytes per address and size).

Inputs are pure functions of the rank; the driver computes what they must give with NumPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import ringtorch.distributed as dist

N = 256


def start(rank: int) -> np.ndarray:
    """The values a rank's buffer starts with."""
    return (np.arange(N) % 7 + rank + 1).astype(np.float32)


def views(rank: int, ws: int) -> dict[str, Any]:
    """What each step left in the buffer, and the error the negated view raised."""
    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    buf = torch.from_numpy(start(rank))
    for step in range(3):
        dist.all_reduce(buf)
        out[f"again {step}"] = buf.numpy().copy()
    dist.all_reduce(buf[: N // 2])  # the same address, fewer bytes
    out["shorter"] = buf.numpy().copy()
    try:
        dist.all_reduce(torch._neg_view(buf))
        out["negated"] = None
    except RuntimeError as exc:
        out["negated"] = str(exc)
    dist.all_reduce(buf)  # the group goes on
    out["after"] = buf.numpy().copy()
    dist.destroy_process_group()
    return out

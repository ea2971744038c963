"""Rank-side code of tests/integration/test_requires_grad.py: collectives and point-to-point
operations on tensors that require grad (``nn.Parameter``s), under ringtorch or torch's gloo.

The same function runs under both libraries (chosen by name), so the driver sees what torch
accepts and what ringtorch does with the same calls. Inputs are pure functions of the rank.
"""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import torch
from torch import nn


def start(rank: int, ws: int) -> np.ndarray:
    """The values a rank's parameter starts with."""
    return (np.arange(6) * (rank + 2) + rank).astype(np.float32)


def _param(values: np.ndarray) -> nn.Parameter:
    return nn.Parameter(torch.from_numpy(values.copy()))


def _state(p: torch.Tensor) -> dict[str, Any]:
    """What the driver checks of a parameter after an operation: its values, that it still
    requires grad and that autograd recorded nothing."""
    return {"values": p.detach().numpy().copy(), "requires_grad": p.requires_grad,
            "grad_fn": p.grad_fn is not None, "grad": p.grad is not None}


def on_parameters(rank: int, ws: int, library: str) -> dict[str, Any]:
    """Each operation on fresh parameters; returns {operation: state of its parameter(s)}."""
    dist: Any = importlib.import_module(library)
    dist.init_process_group("gloo")
    out: dict[str, Any] = {}
    p = _param(start(rank, ws))
    dist.all_reduce(p)
    out["all_reduce"] = _state(p)
    p = _param(start(rank, ws))
    dist.broadcast(p, src=0)
    out["broadcast"] = _state(p)
    p = _param(start(rank, ws))
    parts = [torch.zeros(6) for _ in range(ws)]
    dist.all_gather(parts, p)
    out["all_gather"] = {**_state(p), "parts": [t.numpy() for t in parts]}
    p = _param(start(rank, ws))
    if rank == 0:
        dist.send(p, dst=1)
    elif rank == 1:
        dist.recv(p, src=0)
    out["send_recv"] = _state(p)
    p = _param(start(rank, ws))
    (dist.isend(p, dst=1) if rank == 0 else dist.irecv(p, src=0)).wait()
    out["isend_irecv"] = _state(p)
    # a non-contiguous view of a parameter: staged through a copy and written back
    p = _param(start(rank, ws))
    dist.all_reduce(p.view(2, 3).t())
    out["all_reduce_strided_view"] = _state(p)
    p = _param(start(rank, ws))
    dist.reduce(p, dst=0)
    out["reduce"] = _state(p)
    p = _param(start(rank, ws))
    dist.scatter(p, [_param(start(r, ws)) for r in range(ws)] if rank == 0 else None, src=0)
    out["scatter"] = _state(p)
    if library == "ringtorch.distributed":
        # where torch's gloo refuses parameters (its coalesced copy-back is an autograd
        # in-place write) or has no such reduction (AVG), ringtorch writes them in place too
        p, q = _param(start(rank, ws)), _param(start(rank, ws)[:2])
        dist.all_reduce_coalesced([p, q])
        out["all_reduce_coalesced"] = _state(p)
        p = _param(start(rank, ws))
        dist.all_reduce(p, op=dist.ReduceOp.AVG)
        out["all_reduce_avg"] = _state(p)
    dist.destroy_process_group()
    return out

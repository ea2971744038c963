"""Rank functions of test_parallel_door.py: tensor, sequence and pipeline parallelism on
backend "ringtorch".

The job makes its group as a plain torch program does (``init_process_group("ringtorch")``,
``init_device_mesh("cpu", ...)``) and runs torch's ``parallelize_module`` and
``torch.distributed.pipelining`` on it; it returns raw results (outputs, full gradients,
losses) that the test compares with the same modules run whole in one process.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

MICROBATCHES = 4


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 36), torch.nn.ReLU(), torch.nn.Linear(36, 8))


class Block(torch.nn.Module):
    """A transformer block's MLP half: LayerNorm, Linear up, GELU, Linear down, residual."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.norm = torch.nn.LayerNorm(8)
        self.up = torch.nn.Linear(8, 36)
        self.down = torch.nn.Linear(36, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def deep() -> torch.nn.Sequential:
    """Four Linear layers: two pipeline stages of two."""
    torch.manual_seed(2)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


def data(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone())
            for n, p in module.named_parameters()}


def _tensor_parallel(rank: int, ws: int, mesh: Any) -> dict[str, Any]:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    out: dict[str, Any] = {}
    net = parallelize_module(mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    y = net(data(10, 6, 8))
    y.square().sum().backward()
    out["tp"] = (y.detach(), _grads(net))

    # sequence parallel: each rank holds its slice of the sequence (dim 1) around the MLP
    block = parallelize_module(Block(), mesh, {
        "norm": SequenceParallel(),
        "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),
    })
    x = data(11, 2, 6, 8).chunk(ws, dim=1)[rank]
    local = block(x)  # a plain tensor: this rank's slice of the sequence
    local.square().sum().backward()
    out["sp"] = (type(local).__name__, local.detach(), _grads(block))
    return out


def _pipeline(rank: int, ws: int, schedule: str) -> dict[str, Any]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    layers = list(deep())
    per = len(layers) // ws + (len(layers) % ws > 0)
    stage_module = torch.nn.Sequential(*layers[rank * per:(rank + 1) * per])
    stage = PipelineStage(stage_module, rank, ws, torch.device("cpu"))
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    sched = kind(stage, MICROBATCHES, loss_fn=torch.nn.functional.mse_loss)
    x, target = data(20, 8, 8), data(21, 8, 4)
    losses: list[torch.Tensor] = []
    if rank == 0:
        sched.step(x)
    elif rank == ws - 1:
        output = sched.step(target=target, losses=losses)
    else:
        sched.step()
    return {"first_layer": rank * per, "grads": _grads(stage_module),
            "losses": [loss.item() for loss in losses],
            "output": output.detach() if rank == ws - 1 else None}


def parallel(rank: int, ws: int) -> dict[str, Any]:
    """Tensor and sequence parallel, then pipelining with GPipe and 1F1B."""
    from torch.distributed.device_mesh import init_device_mesh

    warnings.simplefilter("ignore")
    dist.init_process_group("ringtorch")
    out = {"backend": dist.get_backend(), **_tensor_parallel(rank, ws, init_device_mesh(
        "cpu", (ws,)))}
    for schedule in ("gpipe", "1f1b"):
        out[schedule] = _pipeline(rank, ws, schedule)
    dist.destroy_process_group()
    return out

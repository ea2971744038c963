"""Rank functions of test_modern_stack.py: torch's modern stack under ringtorch's paths.

Each rank makes its groups as a user would, through backend "ringtorch"
(``torch.distributed.init_process_group("ringtorch")`` then ``init_device_mesh``), imports the
stack from ``ringtorch.distributed.*`` only, and returns raw results (local shards, full
tensors, warning texts); the test compares them with the same computation on one process.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def stack(rank: int, ws: int, ckpt_dir: str) -> dict[str, Any]:
    """FSDP2, tensor parallel, DCP, functional collectives and the replicate fallback."""
    import ringtorch.distributed._functional_collectives as fc
    import ringtorch.distributed.checkpoint as dcp
    from ringtorch.distributed.checkpoint.state_dict import get_model_state_dict
    from ringtorch.distributed.device_mesh import init_device_mesh
    from ringtorch.distributed.fsdp import FSDPModule, fully_shard
    from ringtorch.distributed.tensor import (
        DTensor,
        Shard,
        distribute_tensor,
        enable_replicate_fallback,
    )
    from ringtorch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    warnings.simplefilter("ignore")
    dist.init_process_group("ringtorch")
    mesh = init_device_mesh("cpu", (ws,))
    out: dict[str, Any] = {"backend": dist.get_backend(mesh.get_group())}
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))

    # FSDP2: one SGD step on this rank's half of the batch; the grads are averaged
    model = _model()
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x.chunk(ws)[rank]).square().sum().backward()
    opt.step()
    out["fsdp2_is_module"] = isinstance(model, FSDPModule)
    out["fsdp2"] = {k: v.full_tensor() for k, v in get_model_state_dict(model).items()}
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=ckpt_dir)

    # tensor parallel: colwise then rowwise; the output is the full model's
    tp = _model()
    parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    out["tp"] = tp(x)

    # DCP: the saved FSDP2 state loads into a fresh sharded model
    fresh = _model()
    fully_shard(fresh, mesh=mesh)
    state = {"model": get_model_state_dict(fresh)}
    dcp.load(state, checkpoint_id=ckpt_dir)
    out["dcp"] = {k: v.full_tensor() for k, v in state["model"].items()}

    out["fc"] = fc.wait_tensor(fc.all_reduce(torch.arange(3.0) * (rank + 1), "sum", mesh))

    # the CPU attention kernel (causal) on head-sharded DTensors: torch refuses, the fallback
    # runs it
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=gen) for _ in range(3))
    dq, dk, dv = (distribute_tensor(t, mesh, [Shard(1)]).requires_grad_() for t in (q, k, v))
    try:
        F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
    except NotImplementedError as exc:
        out["torch_refuses"] = str(exc)
    enable_replicate_fallback()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
        second = F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
        (first * 2 + second).sum().backward()
    out["sdpa"] = (isinstance(first, DTensor), first.placements, first.to_local(),
                   first.full_tensor())
    out["sdpa_grads"] = [t.grad.full_tensor() for t in (dq, dk, dv)]
    out["warnings"] = [str(w.message) for w in caught]
    dist.destroy_process_group()
    return out

"""Rank functions of test_fsdp2_door.py: torch's FSDP2 and DCP on backend "ringtorch".

Each job makes its groups as a plain torch program does (``init_process_group("ringtorch")``,
``init_device_mesh("cpu", ...)``; a gloo group of the same job where the test compares with
gloo) and returns raw results (losses, full tensors, local shards); the test computes what
they must equal with torch in one process, or compares with gloo's run.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

BATCH = 12  # divides by 1, 2, 3 and 4: every rank's local mean has the same weight


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch, the same in every process."""
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, 8, generator=gen), torch.randn(BATCH, 4, generator=gen)


def _sharded(mesh: Any, mp: Any = None) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    net = model()
    kw = {"mesh": mesh} if mp is None else {"mesh": mesh, "mp_policy": mp}
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, **kw)
    return fully_shard(net, **kw)


def train(net: torch.nn.Module, opt: torch.optim.Optimizer, steps: range, rank: int,
          ws: int) -> list[float]:
    """Steps of this rank's slice of each global batch; the losses of this rank."""
    losses = []
    for step in steps:
        x, y = (t.chunk(ws)[rank] for t in batch(step))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _full(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() for k, v in net.state_dict().items()}


def world2(rank: int, ws: int, ckpt: str, async_ckpt: str) -> dict[str, Any]:
    """Mixed precision on ringtorch and on gloo; state dicts after two fp32 steps; a DCP save
    with the optimizer; an async_save on a group of its own while training goes on, then one
    on the default group."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
    )
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

    warnings.simplefilter("ignore")  # torch's FutureWarnings, one per rank
    dist.init_process_group("ringtorch")
    gloo = dist.new_group(backend="gloo")
    mesh = init_device_mesh("cpu", (ws,))
    out: dict[str, Any] = {"backend": dist.get_backend()}
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for name, m in (("ringtorch", mesh), ("gloo", DeviceMesh.from_group(gloo, "cpu"))):
        net = _sharded(m, policy)
        opt = torch.optim.Adam(net.parameters(), lr=1e-2)
        losses = train(net, opt, range(3), rank, ws)
        out[f"mp_{name}"] = (losses, _full(net))
        out[f"mp_{name}_out_dtype"] = net(batch(0)[0]).dtype

    net = _sharded(mesh)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    out["losses"] = train(net, opt, range(2), rank, ws)
    out["sharded"] = {k: (type(v).__name__, [str(p) for p in v.placements], v.to_local().clone())
                      for k, v in net.state_dict().items()}
    out["full"] = get_model_state_dict(net, options=StateDictOptions(full_state_dict=True))
    model_sd, optim_sd = get_state_dict(net, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=ckpt)

    # async_save: the upload runs on a thread of its own and issues collectives; on a group of
    # its own they cannot interleave with the training's on the default group
    saver = dist.new_group(backend="ringtorch")
    future = dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=async_ckpt,
                            process_group=saver)
    out["after_async"] = train(net, opt, range(2, 3), rank, ws)  # while the upload runs
    future.result()
    # on the default group, waited for before the next collective: after the third step
    model_sd, optim_sd = get_state_dict(net, opt)
    dcp.async_save({"model": model_sd, "optim": optim_sd},
                   checkpoint_id=async_ckpt + "_default").result()
    dist.destroy_process_group()
    return out


def resume(rank: int, ws: int, ckpt: str) -> dict[str, Any]:
    """Load the world-2 checkpoint (model and Adam's state) at this world size and train on:
    sharded with FSDP2 at ws > 1, a plain module at ws 1."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    warnings.simplefilter("ignore")
    dist.init_process_group("ringtorch")
    net = _sharded(init_device_mesh("cpu", (ws,))) if ws > 1 else model()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    model_sd, optim_sd = get_state_dict(net, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(net, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    full = _full(net) if ws > 1 else {k: v.clone() for k, v in net.state_dict().items()}
    exp_avg = {k: (v["exp_avg"].full_tensor() if ws > 1 else v["exp_avg"].clone())
               for k, v in get_state_dict(net, opt)[1]["state"].items()}
    losses = train(net, opt, range(2, 4), rank, ws)
    after = _full(net) if ws > 1 else dict(net.state_dict())
    dist.destroy_process_group()
    return {"loaded": full, "exp_avg": exp_avg, "losses": losses, "after": after}

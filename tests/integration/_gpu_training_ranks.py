"""Rank-side code of tests/integration/test_gpu_training.py: DistributedDataParallel on a
module in device memory (the process's runtime: ``sim`` or ``cuda``, from
RINGTORCH_DEVICE_RUNTIME), DataParallel with ``device_ids=[0]``, and the closed feature.

The model and every rank's batch are pure functions of a seed (``model``, ``batch``), so the
driver trains the same model on one process over the whole batch with plain torch and compares.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

import ringtorch.distributed as dist
from ringtorch import _config, _device
from ringtorch._device import place
from ringtorch.distributed import _device_ipc
from ringtorch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from ringtorch.nn.parallel import DataParallel, DistributedDataParallel

STEPS = 3
LR = 0.1


def model() -> nn.Module:
    """Three parameters of 16K+ elements (one bucket each, at a 64 KB cap) and small ones."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 2048), nn.ReLU(), nn.Linear(2048, 8), nn.ReLU(),
                         nn.Linear(8, 3))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 8, generator=g), torch.randn(4, 3, generator=g)


def _host(rt: Any, t: torch.Tensor) -> np.ndarray:
    place.fence(rt)
    return t.detach().to("cpu").numpy().copy()


def _train(rt: Any, rank: int, hook: bool,
           group: Any = None) -> tuple[list[np.ndarray], list[bool]]:
    net = place.to_device(model(), 0, rt)
    ddp = DistributedDataParallel(net, device_ids=[0], bucket_cap_mb=0.0625,
                                  process_group=group)
    if hook:
        ddp.register_comm_hook(None, allreduce_hook)
    on_device = [rt.is_device(b.buffer) for b in ddp.reducer._buckets]
    before = _ipc_rounds()  # after construction's broadcast (over IPC too)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step in range(STEPS):
        x, y = batch(rank, step)
        x, y = place.to_device(x, 0, rt), place.to_device(y, 0, rt)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    on_device.append(_ipc_rounds() - before)  # last: the IPC rounds of the steps
    return [_host(rt, p) for p in net.parameters()], on_device


def _ipc_rounds() -> int:
    return sum(link.round for link in _device_ipc._state.links.values() if link)


def run(rank: int, ws: int) -> dict[str, Any]:
    rt = _device.runtime()
    dist.init_process_group("gloo")
    out: dict[str, Any] = {"runtime": rt.name}
    out["params"], on_device = _train(rt, rank, hook=False)
    out["on_device"], out["ipc_rounds"] = on_device[:-1], on_device[-1]
    out["params_hook"], _ = _train(rt, rank, hook=True)
    out["paths"] = sorted(set(_device_ipc._state.paths.values()))
    # a group whose device all_reduce is staged through host memory instead
    with _config.override(DEVICE_IPC=False):
        staged = dist.new_group(list(range(ws)))
        out["params_staged"], _ = _train(rt, rank, hook=False, group=staged)
    out["staged_path"] = _device_ipc._state.paths[staged.group_name]
    with _config.override(DEVICE_UNCONFIRMED=False):
        try:
            DistributedDataParallel(place.to_device(model(), 0, rt), device_ids=[0])
        except RuntimeError as exc:
            out["closed"] = str(exc)
    dist.destroy_process_group()
    return out


def data_parallel(rank: int, ws: int) -> dict[str, Any]:
    """DataParallel over device 0 of the runtime: the module's output and gradients."""
    rt = _device.runtime()
    net = place.to_device(model(), 0, rt)
    dp = DataParallel(net, device_ids=[0])
    x, y = batch(0, 0)
    nn.functional.mse_loss(dp(place.to_device(x, 0, rt)), place.to_device(y, 0, rt)).backward()
    out: dict[str, Any] = {"device_ids": list(dp.device_ids),
                           "grads": [_host(rt, p.grad) for p in net.parameters()]}
    with _config.override(DEVICE_UNCONFIRMED=False):
        try:
            DataParallel(place.to_device(model(), 0, rt), device_ids=[0])
        except RuntimeError as exc:
            out["closed"] = str(exc)
    return out


def _describe(t: torch.Tensor) -> tuple[bool, torch.Tensor]:
    """On the callee: whether ``t`` arrived in device memory, and twice it, in device memory."""
    rt = _device.runtime()
    arrived = bool(t.is_cuda or rt.is_device(t))
    return arrived, place.to_device(_host_tensor(rt, t) * 2, 0, rt)


def _host_tensor(rt: Any, t: torch.Tensor) -> torch.Tensor:
    place.fence(rt)
    return t.detach().to("cpu")


def rpc_device_map(rank: int, ws: int) -> dict[str, Any]:
    """worker0 maps its device 0 to worker1's device 0 and has no map to worker2."""
    import ringtorch.distributed.rpc as rpc

    rt = _device.runtime()
    name, out = f"worker{rank}", {}
    mapped = rpc.TensorPipeRpcBackendOptions(rpc_timeout=30)
    mapped.set_device_map("worker1", {"cuda:0": "cuda:0"})
    with _config.override(DEVICE_UNCONFIRMED=False):
        try:
            rpc.init_rpc(name, rank=rank, world_size=ws, rpc_backend_options=mapped)
        except ValueError as exc:
            out["closed"] = str(exc)
    try:
        rpc.init_rpc(name, rank=rank, world_size=ws,
                     rpc_backend_options=rpc.TensorPipeRpcBackendOptions(devices=["cpu"]))
    except ValueError as exc:
        out["devices"] = str(exc)
    options = mapped if rank == 0 else rpc.TensorPipeRpcBackendOptions(rpc_timeout=30)
    rpc.init_rpc(name, rank=rank, world_size=ws, rpc_backend_options=options)
    if rank == 0:
        t = place.to_device(torch.arange(6, dtype=torch.float32), 0, rt)
        arrived, back = rpc.rpc_sync("worker1", _describe, args=(t,))
        out["arrived_on_device"] = arrived
        out["back_on_device"] = bool(back.is_cuda or rt.is_device(back))
        out["back"] = _host(rt, back)
        try:
            rpc.rpc_sync("worker2", _describe, args=(t,))
        except RuntimeError as exc:
            out["unmapped"] = str(exc)
        # a CPU tensor still travels as before, to a worker without a map too
        out["cpu"] = rpc.rpc_sync("worker2", torch.add, args=(torch.ones(2), 1)).tolist()
    rpc.shutdown()
    return out

"""torch's ``quantization_hooks``: gradients sent as 8-bit integers through all_gather.

Each rank picks its own affine quantization (scale, zero point) from its bucket's min/max with
torch's observers, all-gathers those parameters, quantizes its bucket to uint8, all-gathers the
quantized buckets and dequantizes and averages every rank's locally. The rule: every rank
dequantizes every rank's bytes with that rank's own parameters, so all end with the same mean.
Per channel, the bucket is cut into rows of ``bucket_size`` elements, each with its own
parameters. (torch 2.13's per-channel hook fails on CPU when it reads the gathered parameters;
this one works.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ringtorch import distributed as dist
from ringtorch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
from ringtorch.distributed.algorithms.ddp_comm_hooks.default_hooks import GradBucket

__all__ = ["quantization_perchannel_hook", "quantization_pertensor_hook"]


def _quantize(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.round(x / scale) + zero_point, 0, 255).to(torch.uint8)


def _dequantize(y: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    return scale * (y.to(torch.float32) - zero_point)


def _gather_and_average(group: Any, params: torch.Tensor, local: torch.Tensor,
                        quantize_mine: Any, dequantize: Any) -> torch.futures.Future[Any]:
    """All-gather every rank's quantization parameters (waited for), then its quantized
    tensor; the future holds the mean of the dequantized tensors."""
    world_size = dist.get_world_size(group)
    all_params = [torch.zeros_like(params) for _ in range(world_size)]
    # waited for here, so that every rank starts the second all_gather from this thread, in
    # bucket order (started from a callback it would race the next bucket's hook)
    dist.all_gather(all_params, params, group=group)
    mine = quantize_mine(local, params)
    gathered = [torch.zeros_like(mine) for _ in range(world_size)]

    def average(fut: torch.futures.Future[Any]) -> torch.Tensor:
        fut.value()  # raises the collective's error, if any
        # each rank's bytes with that rank's own parameters (the lists were filled in place)
        total = torch.zeros_like(gathered[0], dtype=torch.float32)
        for quantized, rank_params in zip(gathered, all_params, strict=True):
            total += dequantize(quantized, rank_params)
        return total / world_size

    work = dist.all_gather(gathered, mine, group=group, async_op=True)
    return work.get_future().then(average)


def quantization_pertensor_hook(process_group: Any, bucket: GradBucket
                                ) -> torch.futures.Future[torch.Tensor]:
    """Send the bucket as uint8 with one scale and zero point per rank (all_gather based,
    so slower than an all-reduce for large groups; experimental, as in torch).

    Example::

        ddp_model.register_comm_hook(None, quantization_pertensor_hook)
    """
    group = default._group(process_group)
    tensor = bucket.buffer()
    observer = torch.ao.quantization.MinMaxObserver().to(tensor.device)
    observer(tensor)
    scale, zero_point = observer.calculate_qparams()
    params = torch.tensor([float(scale), float(zero_point)], dtype=torch.float32)
    return _gather_and_average(
        group, params, tensor,
        lambda x, p: _quantize(x, p[0], p[1]),
        lambda y, p: _dequantize(y, p[0], p[1]))


def quantization_perchannel_hook(process_group: Any, bucket: GradBucket, bucket_size: int = 512
                                 ) -> torch.futures.Future[torch.Tensor]:
    """Send the bucket as uint8 rows of ``bucket_size`` elements, each row with its own scale
    and zero point (finer than per tensor for large buckets).

    Example::

        ddp_model.register_comm_hook(None, quantization_perchannel_hook)
    """
    group = default._group(process_group)
    tensor = bucket.buffer()
    numel = tensor.numel()
    # torch pads to the next multiple, a whole row of zeros when already a multiple
    rows = nn.functional.pad(tensor, (0, bucket_size - numel % bucket_size)).view(-1, bucket_size)
    observer = torch.ao.quantization.PerChannelMinMaxObserver().to(tensor.device)
    observer(rows)
    scales, zero_points = observer.calculate_qparams()
    params = torch.stack((scales.to(torch.float32), zero_points.to(torch.float32)))

    def dequantize(y: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return _dequantize(y, p[0].unsqueeze(1), p[1].unsqueeze(1))

    fut = _gather_and_average(group, params, rows,
                              lambda x, p: _quantize(x, p[0].unsqueeze(1), p[1].unsqueeze(1)),
                              dequantize)
    return fut.then(lambda f: f.value().flatten()[:numel])

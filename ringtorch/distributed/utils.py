"""``torch.distributed.utils``: the private helpers parallel wrappers import from it.

torch lists no public name here (``__all__ = []``); libraries that build their own
data-parallel wrapper on torch's pieces (FSDP-style and DDP-style wrappers, torch's own
``nn.parallel``, fairscale, PiPPy) import:

* ``_verify_param_shape_across_processes``, ``_sync_module_states``,
  ``_sync_params_and_buffers``: implemented here on ringtorch's collectives (all_gather_object
  of the shapes, then coalesced broadcasts from ``src``), with the messages of torch's
  DDP checks;
* ``_to_kwargs``, ``_pack_kwargs``, ``_unpack_kwargs``, ``_recursive_to``,
  ``_apply_to_tensors``, ``_cast_forward_inputs``, ``_replace_by_prefix``, ``_p_assert``,
  ``_alloc_storage``, ``_free_storage``: tensor plumbing with nothing distributed in it,
  re-exported from torch itself (one implementation).
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import torch
import torch.distributed.utils as _torch_utils
from torch import nn

from ringtorch.distributed import (
    ProcessGroup,
    all_gather_object,
    broadcast,
    get_global_rank,
    get_rank,
    get_world_size,
)
from ringtorch.distributed._world import _world

# Tensor plumbing with nothing distributed in it: torch's own functions.
_alloc_storage = _torch_utils._alloc_storage
_apply_to_tensors = _torch_utils._apply_to_tensors
_cast_forward_inputs = _torch_utils._cast_forward_inputs
_free_storage = _torch_utils._free_storage
_p_assert = _torch_utils._p_assert
_pack_kwargs = _torch_utils._pack_kwargs
_recursive_to = _torch_utils._recursive_to
_replace_by_prefix = _torch_utils._replace_by_prefix
_to_kwargs = _torch_utils._to_kwargs
_unpack_kwargs = _torch_utils._unpack_kwargs

__all__: list[str] = []


def _verify_param_shape_across_processes(process_group: ProcessGroup | None,
                                         tensors: list[torch.Tensor],
                                         logger: Any = None) -> None:
    """Check, before their values are broadcast, that this rank holds as many tensors as
    every other rank and that each has rank 0's sizes and strides (torch's checks).

    Raises:
        RuntimeError: torch's message; a count mismatch fails on every rank, a shape mismatch
            on the rank whose tensor differs from rank 0's.
    """
    me = get_rank(process_group)
    mine = [(list(t.shape), list(t.stride())) for t in tensors]
    everyone: list[Any] = [None] * get_world_size(process_group)
    all_gather_object(everyone, mine, group=process_group)
    for rank, theirs in enumerate(everyone):
        if len(theirs) != len(mine):
            raise RuntimeError(f"DDP expects same model across all ranks, but Rank {me} has "
                               f"{len(mine)} params, while rank {rank} has inconsistent "
                               f"{len(theirs)} params.")
    for i, ((sizes, strides), (ref_sizes, ref_strides)) in enumerate(
            zip(mine, everyone[0], strict=True)):
        if sizes != ref_sizes:
            raise RuntimeError(f"[{me}]: params[{i}] in this process with sizes {sizes} appears "
                               f"not to match sizes of the same param in process 0.")
        if strides != ref_strides:
            raise RuntimeError(f"[{me}]: params[{i}] in this process with strides {strides} "
                               f"appears not to match strides of the same param in process 0.")


def _sync_module_states(module: nn.Module, process_group: ProcessGroup | None,
                        broadcast_bucket_size: int, src: int,
                        params_and_buffers_to_ignore: Container[str],
                        broadcast_buffers: bool = True) -> None:
    """Give every rank ``src``'s parameters (and buffers), except the ignored names."""
    states = [p.detach() for n, p in module.named_parameters()
              if n not in params_and_buffers_to_ignore]
    if broadcast_buffers:
        states += [b.detach() for n, b in module.named_buffers()
                   if n not in params_and_buffers_to_ignore]
    _sync_params_and_buffers(process_group, states, broadcast_bucket_size, src)


@torch.no_grad()
def _sync_params_and_buffers(process_group: ProcessGroup | None,
                             module_states: list[torch.Tensor], broadcast_bucket_size: int,
                             src: int) -> None:
    """Broadcast ``module_states`` from group rank ``src``, packed per dtype into messages of
    at most ``broadcast_bucket_size`` bytes."""
    if not module_states:
        return
    group = None if process_group is _world.default_pg else process_group
    src_global = src if group is None else get_global_rank(group, src)
    is_src = get_rank(group) == src
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in module_states:
        by_dtype.setdefault(t.dtype, []).append(t)
    for tensors in by_dtype.values():
        for bucket in _buckets(tensors, broadcast_bucket_size):
            flat = torch.cat([t.reshape(-1) for t in bucket])
            broadcast(flat, src=src_global, group=group)
            if not is_src:
                offset = 0
                for t in bucket:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()


def _buckets(tensors: list[torch.Tensor], nbytes: int) -> list[list[torch.Tensor]]:
    """Consecutive runs of ``tensors`` of at most ``nbytes`` each (a larger tensor alone)."""
    buckets: list[list[torch.Tensor]] = [[]]
    size = 0
    for t in tensors:
        t_bytes = t.numel() * t.element_size()
        if buckets[-1] and size + t_bytes > nbytes:
            buckets.append([])
            size = 0
        buckets[-1].append(t)
        size += t_bytes
    return buckets



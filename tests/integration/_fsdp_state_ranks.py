"""Rank functions of test_fsdp_full_state_dict.py: FSDP1's full state dict offloaded to the CPU.

Each rank makes its group through backend "ringtorch", wraps the same model (per-Linear
wrapping, so the root and its children each hold a flat parameter) and takes
``model.state_dict()`` under FULL_STATE_DICT with ``offload_to_cpu=True``; it returns the
state dict for the test to compare with the unsharded model's, computed there.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5),
                               torch.nn.Linear(5, 3))


def full_state_dicts(rank: int, ws: int, library: str,
                     cases: list[tuple[bool, bool]]) -> dict[str, Any]:
    """For each (use_orig_params, rank0_only): the state dict, or the error it raised."""
    if library == "ringtorch":
        from ringtorch.distributed.fsdp import (
            FullStateDictConfig,
            FullyShardedDataParallel,
            StateDictType,
        )
    else:
        from torch.distributed.fsdp import (
            FullStateDictConfig,
            FullyShardedDataParallel,
            StateDictType,
        )
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    warnings.simplefilter("ignore")
    dist.init_process_group("ringtorch")
    out: dict[str, Any] = {}
    for use_orig_params, rank0_only in cases:
        wrapped = FullyShardedDataParallel(model(), device_id=torch.device("cpu"),
                                           auto_wrap_policy=ModuleWrapPolicy({torch.nn.Linear}),
                                           use_orig_params=use_orig_params)
        config = FullStateDictConfig(offload_to_cpu=True, rank0_only=rank0_only)
        try:
            with FullyShardedDataParallel.state_dict_type(wrapped, StateDictType.FULL_STATE_DICT,
                                                          config):
                state = wrapped.state_dict()
            # what a training step then sees: the live parameters are intact
            loss = wrapped(torch.ones(2, 8)).sum()
            loss.backward()
            after = FullyShardedDataParallel.get_state_dict_type(wrapped)
            out[f"{use_orig_params} {rank0_only}"] = (
                {k: v.clone() for k, v in state.items()}, loss.item(),
                after.state_dict_type, after.state_dict_config.offload_to_cpu)
        except RuntimeError as exc:
            out[f"{use_orig_params} {rank0_only}"] = str(exc)
    dist.destroy_process_group()
    return out

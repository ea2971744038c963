"""FSDP1 whose full state dict with ``offload_to_cpu=True`` works when it computes on the CPU.

torch 2.13's FULL_STATE_DICT with ``FullStateDictConfig(offload_to_cpu=True)`` moves each
unsharded flat parameter "to the CPU" and frees the unsharded storage; on the CPU the move is
no copy, so the freed storage is the one the state dict then reads: a segmentation fault
(``use_orig_params=True``) or ``RuntimeError: setStorage ... storage of size 0`` (False).
Offloading CPU tensors to the CPU is nothing to do, and the full state dict's values are
cloned either way, so this class's ``state_dict_type``/``set_state_dict_type`` hand torch a
copy of the config with ``offload_to_cpu=False`` when every FSDP module under ``module``
computes on the CPU. Everything else is torch's FullyShardedDataParallel, unchanged: no
object or global of torch's is patched, and a module on an accelerator keeps the offload.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.fsdp import (
    FullStateDictConfig,
    OptimStateDictConfig,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)
from torch.distributed.fsdp import FullyShardedDataParallel as _TorchFSDP

__all__ = ["FullyShardedDataParallel"]


class FullyShardedDataParallel(_TorchFSDP):
    """torch's FullyShardedDataParallel; a full state dict offloaded to the CPU works on CPU."""

    @staticmethod
    def set_state_dict_type(
        module: nn.Module,
        state_dict_type: StateDictType,
        state_dict_config: StateDictConfig | None = None,
        optim_state_dict_config: OptimStateDictConfig | None = None,
    ) -> StateDictSettings:
        """See torch's ``FullyShardedDataParallel.set_state_dict_type``."""
        return _TorchFSDP.set_state_dict_type(module, state_dict_type,
                                              _without_cpu_to_cpu_offload(module,
                                                                          state_dict_config),
                                              optim_state_dict_config)

    @staticmethod
    @contextlib.contextmanager
    def state_dict_type(
        module: nn.Module,
        state_dict_type: StateDictType,
        state_dict_config: StateDictConfig | None = None,
        optim_state_dict_config: OptimStateDictConfig | None = None,
    ) -> Iterator[None]:
        """See torch's ``FullyShardedDataParallel.state_dict_type``."""
        previous = FullyShardedDataParallel.set_state_dict_type(
            module, state_dict_type, state_dict_config, optim_state_dict_config)
        try:
            yield
        finally:
            _TorchFSDP.set_state_dict_type(module, previous.state_dict_type,
                                           previous.state_dict_config,
                                           previous.optim_state_dict_config)


def _without_cpu_to_cpu_offload(module: nn.Module,
                                config: StateDictConfig | None) -> StateDictConfig | None:
    """``config`` with ``offload_to_cpu=False`` where offloading would copy CPU to CPU."""
    if type(config) is not FullStateDictConfig or not config.offload_to_cpu:
        return config
    fsdp_modules = _TorchFSDP.fsdp_modules(module)
    cpu = torch.device("cpu")
    if not fsdp_modules or any(m.compute_device != cpu for m in fsdp_modules):
        return config
    kept = copy.copy(config)
    kept.offload_to_cpu = False
    return kept

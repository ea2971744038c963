"""``ringtorch.distributed.algorithms.ddp_comm_hooks``: torch's DDP communication hooks.

``register_ddp_comm_hook(DDPCommHookType.X, model, state)`` registers one of the built-in
hooks on a DistributedDataParallel model; the hooks themselves are in ``default_hooks``,
``powerSGD_hook``, ``post_localSGD_hook``, ``quantization_hooks`` and ``debugging_hooks``
(also reachable as ``default``, ``powerSGD``, ``quantization`` and ``debugging``, as in torch).
Every hook averages over its group through ringtorch.distributed's public collectives.
"""

from __future__ import annotations

import enum
import sys
from functools import partial
from typing import Any

from ringtorch.distributed.algorithms.ddp_comm_hooks import debugging_hooks as debugging
from ringtorch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
from ringtorch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from ringtorch.distributed.algorithms.ddp_comm_hooks import quantization_hooks as quantization

__all__ = ["DDPCommHookType", "register_ddp_comm_hook"]


def _member(value: Any) -> Any:
    # a partial in an Enum body becomes a member only through enum.member from 3.11 on
    return enum.member(value) if sys.version_info >= (3, 11) else value


def _ddp_comm_hook_wrapper(comm_hook: Any, model: Any, state: Any) -> None:
    model.register_comm_hook(state, comm_hook)


def _powerSGD_comm_hook_wrapper(comm_hook: Any, model: Any, state: Any,
                                matrix_approximation_rank: int,
                                start_powerSGD_iter: int = 1_000) -> None:
    """Register a PowerSGD hook; ``state`` is only the process group, as for the others."""
    powerSGD_state = powerSGD.PowerSGDState(process_group=state,
                                            matrix_approximation_rank=matrix_approximation_rank,
                                            start_powerSGD_iter=start_powerSGD_iter)
    model.register_comm_hook(powerSGD_state, comm_hook)


class DDPCommHookType(enum.Enum):
    """The built-in hooks, each value a function ``(model=, state=)`` that registers it.

    ``DDPCommHookType.ALLREDUCE.value(model=model, state=process_group)`` registers the
    all-reduce hook; :func:`register_ddp_comm_hook` does the same.
    """

    ALLREDUCE = _member(partial(_ddp_comm_hook_wrapper, comm_hook=default.allreduce_hook))
    FP16_COMPRESS = _member(partial(_ddp_comm_hook_wrapper,
                                    comm_hook=default.fp16_compress_hook))
    BF16_COMPRESS = _member(partial(_ddp_comm_hook_wrapper,
                                    comm_hook=default.bf16_compress_hook))
    QUANTIZE_PER_TENSOR = _member(partial(_ddp_comm_hook_wrapper,
                                          comm_hook=quantization.quantization_pertensor_hook))
    QUANTIZE_PER_CHANNEL = _member(partial(_ddp_comm_hook_wrapper,
                                           comm_hook=quantization.quantization_perchannel_hook))
    POWER_SGD = _member(partial(_powerSGD_comm_hook_wrapper, comm_hook=powerSGD.powerSGD_hook,
                                matrix_approximation_rank=1))
    POWER_SGD_RANK2 = _member(partial(_powerSGD_comm_hook_wrapper,
                                      comm_hook=powerSGD.powerSGD_hook,
                                      matrix_approximation_rank=2))
    BATCHED_POWER_SGD = _member(partial(_powerSGD_comm_hook_wrapper,
                                        comm_hook=powerSGD.batched_powerSGD_hook,
                                        matrix_approximation_rank=1))
    BATCHED_POWER_SGD_RANK2 = _member(partial(_powerSGD_comm_hook_wrapper,
                                              comm_hook=powerSGD.batched_powerSGD_hook,
                                              matrix_approximation_rank=2))
    NOOP = _member(partial(_ddp_comm_hook_wrapper, comm_hook=debugging.noop_hook))


def register_ddp_comm_hook(comm_hook_type: DDPCommHookType, model: Any,
                           state: Any = None) -> None:
    """Register the built-in hook ``comm_hook_type`` on the DDP ``model``.

    ``state`` is the process group (None: the default group); the PowerSGD types wrap it in
    a ``PowerSGDState`` with torch's defaults (``start_powerSGD_iter=1000``).

    Example::

        register_ddp_comm_hook(DDPCommHookType.FP16_COMPRESS, ddp_model)
    """
    comm_hook_type.value(model=model, state=state)

"""DTensor operators without a sharding strategy, run replicated: gather, compute, re-shard.

torch's DTensor raises ``NotImplementedError: Operator ... does not have a sharding strategy
registered`` for an operator its sharding propagator has no rule for (the CPU attention kernel
behind ``F.scaled_dot_product_attention`` is one). ``enable_replicate_fallback`` registers, for
the operators it is given, a handler in DTensor's table of custom operator handlers (the
extension point torch's own ``loss_parallel`` uses): the handler all-gathers the operator's
DTensor arguments to Replicate, runs the operator on the full local tensors, and wraps each
output as a DTensor placed like the first DTensor argument where the output's shape allows
(same rank, same size on every sharded dim), replicated otherwise. The first call of each
operator warns once, naming it and the bytes it replicated.

Rule kept: nothing changes until ``enable_replicate_fallback`` is called (a program that imports
torch's path only, or ours without calling it, gets torch's behaviour), only operators without a
rule of torch's are taken, and operators that write into their arguments are refused (a
replicated copy cannot stand for a sharded argument written in place).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.distributed.tensor import DTensor, Replicate, Shard

__all__ = ["disable_replicate_fallback", "enable_replicate_fallback"]

_aten = torch.ops.aten

# Operators without a strategy on torch 2.13 that DTensor programs meet on CPU: the attention
# kernel F.scaled_dot_product_attention picks there, forward and backward
CPU_ATTENTION_OPS = (
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
)


@dataclass
class _Fallback:
    """All state of the replicate fallback: the operators it handles, those it warned about."""

    ops: set[torch._ops.OpOverload] = field(default_factory=set)
    warned: set[str] = field(default_factory=set)


_state = _Fallback()


def enable_replicate_fallback(*ops: torch._ops.OpOverload) -> None:
    """Run ``ops`` (default: the CPU attention kernels) replicated on DTensor arguments.

    Raises:
        ValueError: an operator has a sharding strategy or a handler of torch's already, or
            writes into its arguments; the message names it. Nothing is registered then.
    """
    wanted = ops or CPU_ATTENTION_OPS
    dispatcher = DTensor._op_dispatcher
    propagator = dispatcher.sharding_propagator
    for op in wanted:
        if op in _state.ops:
            continue
        if (op in propagator.op_strategy_funcs or op in propagator.op_to_rules
                or op in dispatcher._custom_op_handlers):
            raise ValueError(f"{op} has a sharding strategy of DTensor's already; the replicate "
                             "fallback takes operators without one")
        if op._schema.is_mutable:
            raise ValueError(f"{op} writes into its arguments; the replicate fallback runs only "
                             "operators that return new tensors")
    for op in wanted:
        if op not in _state.ops:
            dispatcher._custom_op_handlers[op] = _run_replicated
            _state.ops.add(op)


def disable_replicate_fallback() -> None:
    """Take every handler ``enable_replicate_fallback`` registered out of DTensor's table."""
    for op in _state.ops:
        DTensor._op_dispatcher._custom_op_handlers.pop(op, None)
    _state.ops.clear()


def _run_replicated(op: torch._ops.OpOverload, args: tuple[object, ...],
                    kwargs: dict[str, object]) -> object:
    flat, spec = pytree.tree_flatten((args, kwargs))
    dtensors = [a for a in flat if isinstance(a, DTensor)]
    first = dtensors[0]
    mesh = first.device_mesh
    replicated_nbytes = 0
    local: list[Any] = []
    for arg in flat:
        if isinstance(arg, DTensor):
            if not all(p.is_replicate() for p in arg.placements):
                replicated_nbytes += arg.numel() * arg.element_size()
            arg = arg.redistribute(mesh, [Replicate()] * mesh.ndim).to_local()
        local.append(arg)
    local_args, local_kwargs = pytree.tree_unflatten(local, spec)
    _warn_once(op, replicated_nbytes)
    out = op(*local_args, **local_kwargs)
    return pytree.tree_map_only(torch.Tensor, lambda t: _placed_like(t, first), out)


def _placed_like(full: torch.Tensor, like: DTensor) -> DTensor:
    """``full`` (the same on every rank) as a DTensor sharded as ``like`` where it can be."""
    mesh = like.device_mesh
    replicated = DTensor.from_local(full, mesh, [Replicate()] * mesh.ndim, run_check=False)
    if not all(isinstance(p, (Replicate, Shard)) for p in like.placements):
        return replicated
    fits = full.ndim == like.ndim and all(
        full.shape[p.dim] == like.shape[p.dim] for p in like.placements if isinstance(p, Shard))
    if not fits:
        return replicated
    # Replicate -> Shard is a local slice: no communication
    return replicated.redistribute(mesh, like.placements)


def _warn_once(op: torch._ops.OpOverload, nbytes: int) -> None:
    if str(op) in _state.warned:
        return
    _state.warned.add(str(op))
    warnings.warn(f"DTensor operator {op} has no sharding strategy: ringtorch ran it "
                  f"replicated (all-gathered its DTensor arguments, replicated {nbytes} bytes) "
                  "and re-sharded its outputs like its first DTensor argument", stacklevel=2)

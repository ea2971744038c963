"""ringtorch.distributed.optim: torch's DistributedOptimizer on ringtorch's RPC and autograd.

One local optimizer is created on each owner of the parameters (``rpc.remote``); ``step``
runs them all concurrently with the gradients of one distributed autograd context. The rule
it keeps: optimizers on one worker step under one lock, so several trainers stepping at once
never interleave inside an update.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import ringtorch.distributed.autograd as dist_autograd
import ringtorch.distributed.rpc as rpc
from ringtorch.distributed.optim.post_localSGD_optimizer import PostLocalSGDOptimizer
from ringtorch.distributed.optim.zero_redundancy_optimizer import ZeroRedundancyOptimizer


class _LocalOptimizer:
    """The optimizer of the parameters one worker owns."""

    global_lock = threading.Lock()  # one per worker process, as torch's

    def __init__(self, optimizer_class: Any, local_params_rref: list[Any], *args: Any,
                 **kwargs: Any) -> None:
        self._params = [rref.local_value() for rref in local_params_rref]
        self.optim = optimizer_class(self._params, *args, **kwargs)

    def step(self, context_id: int) -> None:
        grads = dist_autograd.get_gradients(context_id)
        with _LocalOptimizer.global_lock:
            for param in self._params:
                param.grad = grads.get(param)
            self.optim.step()


def _new_local_optimizer(optimizer_class: Any, params: list[Any], args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> _LocalOptimizer:
    return _LocalOptimizer(optimizer_class, params, *args, **kwargs)


def _local_step(optimizer_rref: Any, context_id: int) -> None:
    optimizer_rref.local_value().step(context_id)


class DistributedOptimizer:
    """torch.distributed.optim.DistributedOptimizer: ``step(context_id)`` on every owner."""

    def __init__(self, optimizer_class: Any, params_rref: list[Any], *args: Any,
                 **kwargs: Any) -> None:
        by_owner: dict[Any, list[Any]] = defaultdict(list)
        for rref in params_rref:
            by_owner[rref.owner()].append(rref)
        self.remote_optimizers = [
            rpc.remote(owner, _new_local_optimizer, args=(optimizer_class, rrefs, args, kwargs))
            for owner, rrefs in by_owner.items()]

    def step(self, context_id: int) -> None:
        """One step of every local optimizer with ``context_id``'s gradients (concurrently).

        Raises:
            RuntimeError: unknown context; the first error of any owner's step.
        """
        dist_autograd.get_gradients(context_id)  # an unknown context fails here, as in torch
        me = rpc.get_worker_info()
        futures = [rpc.rpc_async(opt.owner(), _local_step, args=(opt, context_id))
                   for opt in self.remote_optimizers if opt.owner() != me]
        errors = []
        for opt in self.remote_optimizers:  # our own optimizer runs here meanwhile
            if opt.owner() == me:
                try:
                    _local_step(opt, context_id)
                except Exception as exc:
                    errors.append(exc)
        for future in futures:
            try:
                future.wait()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]


__all__ = ["DistributedOptimizer", "PostLocalSGDOptimizer", "ZeroRedundancyOptimizer"]


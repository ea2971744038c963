"""torch's ``post_localSGD_hook``: global gradient averaging first, local (subgroup) after.

Post-local SGD (Lin et al., 2018): for ``start_localSGD_iter`` iterations DDP averages the
gradients over the whole group; afterwards only within ``subgroup`` (or not at all), and a
model averager (``model_averaging.averagers.PeriodicModelAverager``) averages the parameters
over everyone every few steps, after the optimizer step.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ringtorch import distributed as dist
from ringtorch.distributed.algorithms.ddp_comm_hooks import default_hooks as default
from ringtorch.distributed.algorithms.ddp_comm_hooks.default_hooks import GradBucket
from ringtorch.futures import Future

__all__ = ["PostLocalSGDState", "post_localSGD_hook"]

logger = logging.getLogger(__name__)


class PostLocalSGDState:
    """When to switch from global to local gradient averaging, and the groups for each.

    Args:
        process_group: the global group (None: the default group).
        subgroup: the local group used after the switch (None: made on first use with
            ``new_subgroups()``, which needs CUDA devices to size it, as in torch).
        start_localSGD_iter: the iteration from which gradients are averaged locally.
        post_local_gradient_allreduce: False: after the switch, no gradient averaging at all.
    """

    __slots__ = ["process_group", "subgroup", "start_localSGD_iter",
                 "post_local_gradient_allreduce", "iter"]

    def __init__(self, process_group: Any, subgroup: Any, start_localSGD_iter: int,
                 post_local_gradient_allreduce: bool = True) -> None:
        logger.info("Local SGD will be started after %s iterations", start_localSGD_iter)
        self.process_group = process_group
        self.subgroup = subgroup
        self.start_localSGD_iter = start_localSGD_iter
        self.post_local_gradient_allreduce = post_local_gradient_allreduce
        self.iter = 0

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        """Count an iteration when its last bucket is processed."""
        if bucket.is_last():
            self.iter += 1
        if self.iter == self.start_localSGD_iter:
            logger.info("Start to apply local SGD after %s iterations.", self.iter)


def post_localSGD_hook(state: PostLocalSGDState, bucket: GradBucket
                       ) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over ``state.process_group``, then, from ``start_localSGD_iter``
    on, over ``state.subgroup`` only.

    Example::

        state = PostLocalSGDState(process_group=None, subgroup=subgroup,
                                  start_localSGD_iter=10)
        ddp_model.register_comm_hook(state, post_localSGD_hook)
    """
    tensor = bucket.buffer()
    if state.iter < state.start_localSGD_iter:
        state.maybe_increase_iter(bucket)
        return default._allreduce_fut(default._group(state.process_group), tensor)
    if not state.post_local_gradient_allreduce:
        fut: Future[torch.Tensor] = Future()
        fut.set_result(tensor)
        return fut
    if state.subgroup is None:
        state.subgroup, _ = dist.new_subgroups()
    return default._allreduce_fut(state.subgroup, tensor)

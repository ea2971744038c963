"""Model averagers: when to average parameters (torch's ``averagers``).

``PeriodicModelAverager`` averages every ``period`` steps once ``warmup_steps`` have passed,
counting one step per call; with ``post_localSGD_hook`` it runs post-local SGD. The rule: every
rank calls ``average_parameters`` once per step, so all agree on which steps average.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

import torch

from ringtorch import distributed as dist
from ringtorch.distributed.algorithms.model_averaging import utils

__all__ = ["ModelAverager", "PeriodicModelAverager"]


class ModelAverager(ABC):
    """Base class of model averagers: a group (None: the default group) and a step count."""

    def __init__(self, process_group: Any = None) -> None:
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.step = 0

    @abstractmethod
    def average_parameters(self, params: Any) -> None:
        raise NotImplementedError


class PeriodicModelAverager(ModelAverager):
    """Average parameters every ``period`` steps after ``warmup_steps`` steps.

    Args:
        period: steps between averagings (1 warns: DDP alone would do).
        warmup_steps: steps during which nothing is averaged.
        process_group: the group to average over (None: the default group).

    Raises:
        ValueError: ``warmup_steps`` is negative or ``period`` below 1 (torch's messages).
    """

    def __init__(self, period: int, warmup_steps: int = 0, process_group: Any = None) -> None:
        super().__init__(process_group)
        if warmup_steps < 0:
            raise ValueError("Arg ``warmup_steps`` must be a non-negative number.")
        self.warmup_steps = warmup_steps
        if period < 1:
            raise ValueError("Arg ``period`` must be a positive value.")
        if period == 1:
            warnings.warn("When period is 1, no need to use model averaging because the "
                          "communication cost of all-reducing parameters will be no less than "
                          "the cost of all-reducing gradients by DistributedDataParallel in "
                          "the backward pass. Therefore, only DistributedDataParallel should "
                          "be used for this case.", stacklevel=2)
        self.period = period

    def average_parameters(self, params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]]
                           ) -> None:
        """Average ``params`` (a model's parameters or an optimizer's parameter groups) if this
        step is past the warm-up and on the period; count the step either way."""
        if self.step >= self.warmup_steps and (self.step - self.warmup_steps) % self.period == 0:
            utils.average_parameters_or_parameter_groups(params, self.process_group)
        self.step += 1

"""Hierarchical model averaging (torch's ``HierarchicalModelAverager``; Lin et al., 2020).

Groups of growing size average at growing periods: with ``{2: 2, 4: 4}`` at world 4, pairs of
ranks average every 2 steps and everyone every 4. At a step only the group with the largest
period that divides the step averages (the smaller groups lie inside it). The groups are
consecutive ranks of the overall group, made once with ``new_subgroups``.
"""

from __future__ import annotations

import logging
import warnings
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

import torch

from ringtorch import distributed as dist
from ringtorch.distributed.algorithms.model_averaging import averagers, utils

__all__ = ["HierarchicalModelAverager"]

logger = logging.getLogger(__name__)


class HierarchicalModelAverager(averagers.ModelAverager):
    """Average parameters in a hierarchy of groups, each at its own period.

    Args:
        period_group_size_dict: ordered ``{period: group size}``; the last size must be the
            size of ``process_group``.
        warmup_steps: steps during which nothing is averaged.
        process_group: the overall group (None: the default group).

    Raises:
        ValueError: the dict is empty, its first period is not positive, its last size is not
            the overall group's size, or ``warmup_steps`` is negative (torch's messages).
    """

    def __init__(self, period_group_size_dict: dict[int, int] | None = None,
                 warmup_steps: int = 0, process_group: Any = None) -> None:
        super().__init__(process_group)
        if not period_group_size_dict:
            raise ValueError("Arg ``period_group_size_dict`` must not be empty.")
        self._periods = list(period_group_size_dict.keys())
        if self._periods[0] <= 0:
            raise ValueError("The minimum period in arg ``period_group_size_dict`` must be a "
                             "positive value.")
        if self._periods[-1] == 1:
            warnings.warn("When the maximum period in arg ``period_group_size_dict`` is 1, no "
                          "need to use model averaging because the communication cost of "
                          "all-reducing parameters will be no less than the cost of "
                          "all-reducing gradients by DistributedDataParallel in the backward "
                          "pass. Therefore, only DistributedDataParallel should be used for "
                          "this case.", stacklevel=2)
        overall = dist.get_world_size(group=self.process_group)
        last = list(period_group_size_dict.values())[-1]
        if last != overall:
            raise ValueError(f"The last value in arg ``period_group_size_dict`` {last} must be "
                             f"equal to the size of arg ``process_group`` {overall}.")
        self.period_process_group_dict: OrderedDict[int, Any] = OrderedDict()
        for period, group_size in period_group_size_dict.items():
            logger.info("Each group that has %s processes average parameters every %s "
                        "iterations, if no higher-level averaging.", group_size, period)
            if group_size != overall:
                self.period_process_group_dict[period], _ = dist.new_subgroups(
                    group_size=group_size, group=self.process_group)
            else:
                self.period_process_group_dict[period] = self.process_group
        if warmup_steps < 0:
            raise ValueError("Arg ``warmup_steps`` must be a non-negative number.")
        self.warmup_steps = warmup_steps

    def _find_process_group(self) -> Any:
        """The group of the largest period dividing the current step, or None."""
        for period in reversed(self._periods):
            if self.step % period == 0:
                return self.period_process_group_dict[period]
        return None

    def average_parameters(self, params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]]
                           ) -> None:
        """Average ``params`` in the group whose turn it is (if any, after the warm-up);
        count the step either way."""
        if self.step >= self.warmup_steps:
            group = self._find_process_group()
            if group is not None:
                utils.average_parameters_or_parameter_groups(params, group)
        self.step += 1

"""Join: training on uneven inputs, so that a rank that runs out of batches never hangs the rest.

torch's ``torch.distributed.algorithms.join`` (Join, Joinable, JoinHook), same names, arguments
and errors, over the public names of ``ringtorch.distributed``. DDP (``ringtorch.nn.parallel``,
which re-exports the three names) and ZeroRedundancyOptimizer (``ringtorch.distributed.optim``)
are its joinables. The rule kept: every collective a non-joined rank issues in an iteration is
matched, in the same order, by the joined ranks' main hooks, so the collectives line up; once
every rank has joined, the post hooks run once on each rank.

Per iteration a non-joined rank all_reduces a 1 (``notify_join_context``); a joined rank
all_reduces a 0 in ``_get_num_nonjoined_procs``, reads the sum (the number of ranks still
training) and, while it is positive, runs its hooks to shadow that iteration.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from types import TracebackType
from typing import Any, NamedTuple

import torch

from ringtorch import distributed as dist

__all__ = ["Join", "JoinHook", "Joinable"]


class JoinHook:
    """The two entry points a Joinable gives the join context manager.

    ``main_hook`` runs once per iteration of the non-joined ranks, on a rank that has joined,
    to shadow that iteration's collectives; ``post_hook`` runs once when every rank has joined.
    """

    def main_hook(self) -> None:
        """Shadow the collectives of one training iteration (forward, backward, step)."""

    def post_hook(self, is_last_joiner: bool) -> None:
        """Run once every rank has joined; ``is_last_joiner`` is True on the ranks that joined last."""


class _JoinConfig(NamedTuple):
    """What a Joinable needs to know about the join context it is in."""

    enable: bool
    throw_on_early_termination: bool
    is_first_joinable: bool

    @staticmethod
    def construct_disabled_join_config() -> _JoinConfig:
        return _JoinConfig(enable=False, throw_on_early_termination=False, is_first_joinable=False)


class Joinable(ABC):
    """A class that can take part in :class:`Join`: it provides a hook, a device and a group."""

    @abstractmethod
    def __init__(self) -> None:
        super().__init__()
        self._join_config = _JoinConfig.construct_disabled_join_config()

    @abstractmethod
    def join_hook(self, **kwargs: Any) -> JoinHook:
        """Return the :class:`JoinHook` for this object; ``kwargs`` come from ``Join(...)``."""

    @property
    @abstractmethod
    def join_device(self) -> torch.device:
        """The device the join context's own all_reduces use."""

    @property
    @abstractmethod
    def join_process_group(self) -> Any:
        """The process group the join context's own all_reduces use."""


class Join:
    """Context manager that runs the joinables' hooks once this rank has run out of inputs.

    Args:
        joinables: the participating :class:`Joinable` objects; their hooks run in this order.
        enable: False turns the manager into a no-op (inputs known to be even).
        throw_on_early_termination: raise on every rank as soon as one rank runs out, instead
            of shadowing its collectives.
        kwargs: passed to every ``join_hook`` (e.g. ``divide_by_initial_world_size``).

    Raises:
        ValueError: no joinables, or joinables on different process groups.
    """

    def __init__(self, joinables: list[Joinable], enable: bool = True,
                 throw_on_early_termination: bool = False, **kwargs: Any) -> None:
        if len(joinables) == 0:
            raise ValueError("The join context manager requires at least one joinable")
        self._joinables = joinables
        self._join_hooks = [joinable.join_hook(**kwargs) for joinable in joinables]
        self._enable = enable
        self._throw_on_early_termination = throw_on_early_termination
        for position, joinable in enumerate(joinables):
            joinable._join_config = _JoinConfig(enable, throw_on_early_termination,
                                                is_first_joinable=position == 0)
        self._process_group = joinables[0].join_process_group
        self._device = joinables[0].join_device
        if any(j.join_process_group != self._process_group for j in joinables[1:]):
            raise ValueError("Using join context manager with multiple process groups")
        self._rank = dist.get_rank(self._process_group)

    def __enter__(self) -> Join:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        """Shadow the other ranks' iterations until all have joined, then run the post hooks.

        Raises:
            RuntimeError: ``throw_on_early_termination`` and this rank ran out first.
        """
        try:
            if not self._enable or exc_type is not None:
                return  # an exception in the body propagates as it is
            is_last_joiner = True
            shadowed = 0
            while self._get_num_nonjoined_procs() > 0:
                if shadowed == 1000:
                    warnings.warn(f"Detected uneven input skew of greater than 1000. This means "
                                  f"that rank {self._rank} has at least 1000 fewer inputs than "
                                  f"other currently-active ranks. This level of skew could lead "
                                  f"to performance degradation during training.", stacklevel=2)
                if self._throw_on_early_termination:
                    self._notify_procs_to_terminate()
                for hook in self._join_hooks:
                    hook.main_hook()
                is_last_joiner = False
                shadowed += 1
            for hook in self._join_hooks:
                hook.post_hook(is_last_joiner)
        finally:
            for joinable in self._joinables:
                joinable._join_config = _JoinConfig.construct_disabled_join_config()

    def _get_num_nonjoined_procs(self) -> int:
        count = torch.zeros(1, device=self._device)
        dist.all_reduce(count, group=self._process_group)
        return int(count.item())

    def _notify_procs_to_terminate(self) -> None:
        ones = torch.ones(1, device=self._device)
        dist.all_reduce(ones, group=self._process_group)
        raise RuntimeError(f"Rank {self._rank} exhausted all inputs.")

    @staticmethod
    def notify_join_context(joinable: Joinable) -> Any:
        """Tell the join context that this rank has not joined yet; call before each iteration.

        Only the first joinable of the context communicates. Returns the async all_reduce's
        work handle (or None for the others and outside a context).

        Raises:
            RuntimeError: ``throw_on_early_termination`` and some rank has run out of inputs.
        """
        if not hasattr(joinable, "_join_config"):
            raise AssertionError(f"Check that the {type(joinable)} constructor calls the "
                                 "``Joinable`` constructor")
        config = joinable._join_config
        if not config.is_first_joinable or not config.enable:
            return None
        ones = torch.ones(1, device=joinable.join_device)
        work = dist.all_reduce(ones, group=joinable.join_process_group, async_op=True)
        if config.throw_on_early_termination:
            zeros = torch.zeros(1, device=joinable.join_device)
            dist.all_reduce(zeros, group=joinable.join_process_group)
            if zeros.item():
                raise RuntimeError("Detected at least one rank that exhausted inputs. "
                                   "Throwing across all ranks.")
        return work

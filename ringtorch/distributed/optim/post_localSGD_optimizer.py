"""torch's ``PostLocalSGDOptimizer``: a local optimizer, then a model averager, every step.

Wraps any ``torch.optim.Optimizer``: ``step()`` runs it, then lets the averager (for example a
``PeriodicModelAverager``) average the parameters if it is its turn. The averager's step count
is saved in ``state_dict()`` under ``"step"``, so a resumed run does not warm up again.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ringtorch.distributed.algorithms.model_averaging import averagers

__all__ = ["PostLocalSGDOptimizer"]


class PostLocalSGDOptimizer(torch.optim.Optimizer):
    """Run ``optim`` at every step and ``averager.average_parameters`` after it.

    Args:
        optim: the local optimizer.
        averager: decides when the parameters are averaged, and over which group.

    Example::

        averager = averagers.PeriodicModelAverager(period=4, warmup_steps=100)
        opt = PostLocalSGDOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), averager)
    """

    def __init__(self, optim: torch.optim.Optimizer, averager: averagers.ModelAverager) -> None:
        # torch.optim.Optimizer.__init__ is not called, as in torch: the state is optim's
        self.optim = optim
        self.param_groups = self.optim.param_groups
        self.averager = averager

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optim.state

    def __repr__(self) -> str:
        return self.optim.__repr__()

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        """The local optimizer's state dict plus the averager's step under ``"step"``."""
        state = self.optim.state_dict()
        state["step"] = self.averager.step
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        """Load the local optimizer's state and the averager's step (0, with a warning, if the
        dict has none)."""
        self.optim.load_state_dict(state_dict)
        if "step" in state_dict:
            self.averager.step = state_dict["step"]
        else:
            warnings.warn("Loaded state dict does not contain a step counter for an averager. "
                          "Setting step counter to 0.", stacklevel=2)
            self.averager.step = 0

    def step(self) -> None:  # type: ignore[override]
        """One local step, then averaging if it is the averager's turn."""
        self.optim.step()
        self.averager.average_parameters(params=self.param_groups)

    def zero_grad(self, set_to_none: bool = True) -> None:  # type: ignore[override]
        self.optim.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:  # type: ignore[override]
        self.optim.add_param_group(param_group)

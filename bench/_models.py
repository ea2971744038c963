"""The benchmarks' model: an MLP whose layer widths are given, the same in every process."""

from __future__ import annotations

import torch
from torch import nn


def make_model(widths: list[int]) -> nn.Module:
    """Linear layers of ``widths`` with ReLU between them, seeded so that every rank and both
    stacks start from the same parameters."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)

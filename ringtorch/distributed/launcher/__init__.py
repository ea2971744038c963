"""``torch.distributed.launcher``'s place: launching workers from a Python program.

See :mod:`ringtorch.distributed.launcher.api`.
"""

from __future__ import annotations

from ringtorch.distributed.launcher.api import LaunchConfig, elastic_launch, launch_agent

__all__ = ["LaunchConfig", "elastic_launch", "launch_agent"]

"""``ringtorch.utils.data``: the one data utility that depends on the process group.

``DistributedSampler`` is ``torch.utils.data.DistributedSampler`` with ringtorch's process
group as the default source of ``num_replicas`` and ``rank``; for the same arguments it yields
the same indices as torch's, so a run can move between torch and ringtorch and see the same data.
"""

from __future__ import annotations

from ringtorch.utils.data.distributed_sampler import DistributedSampler

__all__ = ["DistributedSampler"]

"""torch.utils counterparts that need ringtorch.distributed: only ``data`` (DistributedSampler)."""

from __future__ import annotations

__all__: list[str] = []

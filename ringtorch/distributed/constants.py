"""``torch.distributed.constants``: the default timeouts of process groups (torch's values)."""

from __future__ import annotations

from ringtorch.distributed.distributed_c10d import default_pg_nccl_timeout, default_pg_timeout

__all__ = ["default_pg_nccl_timeout", "default_pg_timeout"]

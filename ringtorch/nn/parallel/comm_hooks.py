"""torch's default DDP communication hooks, also reachable from ``ringtorch.nn.parallel``.

The one implementation is ``ringtorch.distributed.algorithms.ddp_comm_hooks.default_hooks``
(torch's path); this module only re-exports it, for programs written against the older path.
"""

from __future__ import annotations

from ringtorch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
    allreduce_hook,
    bf16_compress_hook,
    bf16_compress_wrapper,
    fp16_compress_hook,
    fp16_compress_wrapper,
)

__all__ = ["allreduce_hook", "bf16_compress_hook", "bf16_compress_wrapper",
           "fp16_compress_hook", "fp16_compress_wrapper"]

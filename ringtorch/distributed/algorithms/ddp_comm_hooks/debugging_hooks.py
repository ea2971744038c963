"""torch's ``debugging_hooks``: a hook that communicates nothing, for headroom analysis.

With ``noop_hook`` registered DDP trains without averaging gradients; how much faster it runs
says how much time gradient communication costs. Never use it to train for real.
"""

from __future__ import annotations

from typing import Any

import torch

from ringtorch.distributed import GradBucket
from ringtorch.futures import Future

__all__ = ["noop_hook"]


def noop_hook(_: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A future already holding the bucket's own (local, unaveraged) gradients.

    Example::

        ddp_model.register_comm_hook(None, noop_hook)
    """
    fut: Future[torch.Tensor] = Future()
    fut.set_result(bucket.buffer())
    return fut

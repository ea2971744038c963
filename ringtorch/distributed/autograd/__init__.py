"""ringtorch.distributed.autograd: torch.distributed.autograd on ringtorch's RPC agent.

Nothing has to be imported in advance: distributed autograd is an RPC extension
(``ringtorch.distributed.rpc.extensions``) that the agent loads the first time a message
carries a context or a request of its kinds arrives, as torch's workers take part in a
distributed backward without importing ``torch.distributed.autograd``.
"""

from __future__ import annotations

from ringtorch.distributed.autograd import engine  # noqa: F401  (dist_autograd.engine)
from ringtorch.distributed.autograd.api import backward, context, get_gradients
from ringtorch.distributed.autograd.context import DistAutogradContext

__all__ = ["DistAutogradContext", "backward", "context", "get_gradients"]

"""ringtorch.distributed.autograd: torch.distributed.autograd on ringtorch's RPC agent.

Importing it registers the backward/release message handlers and installs the context
container on the RPC agent (now, and on every later ``init_rpc``). Every worker of a job that
uses distributed autograd must import it (``import ringtorch.distributed.autograd``) before
the first RPC made in a context reaches it.
"""

from __future__ import annotations

from ringtorch.distributed.autograd import engine
from ringtorch.distributed.autograd.api import backward, context, get_gradients
from ringtorch.distributed.autograd.context import DistAutogradContext
from ringtorch.distributed.rpc import agent as _agent

if engine.install not in _agent.agent_start_hooks:
    _agent.agent_start_hooks.append(engine.install)
if _agent._current is not None:
    engine.install(_agent._current)

__all__ = ["DistAutogradContext", "backward", "context", "get_gradients"]

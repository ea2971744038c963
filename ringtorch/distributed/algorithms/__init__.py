"""``ringtorch.distributed.algorithms``: torch.distributed.algorithms' training algorithms.

The generic join context manager (``Join``, ``Joinable``, ``JoinHook``, exported here as torch's
package does), DDP communication hooks (``ddp_comm_hooks``) and model averaging
(``model_averaging``), written over the public names of ``ringtorch.distributed`` and
``ringtorch.futures`` only, so that they run on any backend the facade offers. Importing this
package imports neither of the last two.
"""

from __future__ import annotations

from ringtorch.distributed.algorithms.join import Join, Joinable, JoinHook

__all__ = ["Join", "JoinHook", "Joinable"]

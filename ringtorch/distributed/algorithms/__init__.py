"""ringtorch.distributed.algorithms: torch's ``torch.distributed.algorithms``.

Training algorithms built on the public names of ``ringtorch.distributed``; like torch's
package it exports the generic join context manager (``Join``, ``Joinable``, ``JoinHook``).
"""

from __future__ import annotations

from ringtorch.distributed.algorithms.join import Join, Joinable, JoinHook

__all__ = ["Join", "JoinHook", "Joinable"]

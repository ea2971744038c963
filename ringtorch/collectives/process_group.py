"""ProcessGroup: torch's ``ProcessGroup`` methods over a ringtorch backend.

A ProcessGroup checks the caller's arguments (checks.py, before anything is sent), turns
tensors and NumPy arrays into the flat contiguous tensors a backend moves (_buffers.py),
orders the work and wraps it in Works (group_base.py). Collectives go down the group's
collective lane (comm_thread.py), which stamps each with the group's sequence number; a
synchronous one on an idle lane runs on the caller's thread. Point-to-point operations go
down per-peer lanes so that a waiting receive never blocks a send (p2p.py). Ranks here are
group ranks; the facade (ringtorch.distributed) translates global ones.
"""

from __future__ import annotations

import enum

from ringtorch.collectives.group_base import CollectiveCheck
from ringtorch.collectives.movement import MovementOps
from ringtorch.collectives.p2p import P2POps
from ringtorch.collectives.reductions import ReductionOps


class BackendType(enum.Enum):
    """torch's ``ProcessGroup.BackendType``."""

    UNDEFINED = 0
    GLOO = 1
    NCCL = 2
    UCC = 3
    MPI = 4
    XCCL = 5
    CUSTOM = 6


class ProcessGroup(ReductionOps, MovementOps, P2POps):
    """A group of ranks and the operations they run together (torch's ``ProcessGroup``).

    Args:
        store: the group's private store (what its backend rendezvoused through).
        rank, size: this process's group rank and the number of ranks.
        backend: the object that moves the bytes (None: every operation raises).
        backend_name: what ``name()`` reports ("gloo" for ringtorch's native backend).
        group_name, group_desc: the group's name ("0", "1", ...) and description.
        timeout: the default timeout of one operation.
        global_ranks: the global rank of each group rank.
    """

    BackendType = BackendType


__all__ = ["BackendType", "CollectiveCheck", "ProcessGroup"]

"""Per-call options of ProcessGroup operations, with torch's class and field names.

torch's option structs (``AllreduceOptions().reduceOp = op``) are mutable C++ objects; ours
are frozen dataclasses built per call with keywords (``AllreduceOptions(reduceOp=op)``), so
that an options object shared between calls can never change under a queued operation. The
field names are torch's camelCase ones because code written against ``ProcessGroup`` passes
them by name. ``timeout=None`` means "the group's timeout".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ringtorch.collectives.reduce_op import ReduceOp


@dataclass(frozen=True)
class BroadcastOptions:
    """Options of ``ProcessGroup.broadcast``: the root's group rank and tensor index."""

    rootRank: int = 0
    rootTensor: int = 0
    timeout: timedelta | None = None
    asyncOp: bool = True


@dataclass(frozen=True)
class AllreduceOptions:
    """Options of ``ProcessGroup.allreduce``: the reduction."""

    reduceOp: Any = ReduceOp.SUM
    timeout: timedelta | None = None
    asyncOp: bool = True
    sparseIndices: Any = None


@dataclass(frozen=True)
class AllreduceCoalescedOptions(AllreduceOptions):
    """Options of ``ProcessGroup.allreduce_coalesced`` (the same as all_reduce's)."""


@dataclass(frozen=True)
class ReduceOptions:
    """Options of ``ProcessGroup.reduce``: the reduction and the root's group rank."""

    reduceOp: Any = ReduceOp.SUM
    rootRank: int = 0
    rootTensor: int = 0
    timeout: timedelta | None = None
    asyncOp: bool = True


@dataclass(frozen=True)
class AllgatherOptions:
    """Options of ``ProcessGroup.allgather`` and its single-tensor forms."""

    timeout: timedelta | None = None
    asyncOp: bool = True


@dataclass(frozen=True)
class GatherOptions:
    """Options of ``ProcessGroup.gather``: the root's group rank."""

    rootRank: int = 0
    timeout: timedelta | None = None
    asyncOp: bool = True


@dataclass(frozen=True)
class ScatterOptions:
    """Options of ``ProcessGroup.scatter``: the root's group rank."""

    rootRank: int = 0
    timeout: timedelta | None = None
    asyncOp: bool = True


@dataclass(frozen=True)
class ReduceScatterOptions:
    """Options of ``ProcessGroup.reduce_scatter`` and its single-tensor form."""

    reduceOp: Any = ReduceOp.SUM
    timeout: timedelta | None = None
    asyncOp: bool = True


@dataclass(frozen=True)
class AllToAllOptions:
    """Options of ``ProcessGroup.alltoall`` and ``alltoall_base``."""

    timeout: timedelta | None = None
    asyncOp: bool = True


@dataclass(frozen=True)
class BarrierOptions:
    """Options of ``ProcessGroup.barrier`` (``device_ids`` is accepted and unused on CPU)."""

    device_ids: list[int] = field(default_factory=list)
    device: Any = None
    timeout: timedelta | None = None
    asyncOp: bool = True


__all__ = [
    "AllToAllOptions",
    "AllgatherOptions",
    "AllreduceCoalescedOptions",
    "AllreduceOptions",
    "BarrierOptions",
    "BroadcastOptions",
    "GatherOptions",
    "ReduceOptions",
    "ReduceScatterOptions",
    "ScatterOptions",
]

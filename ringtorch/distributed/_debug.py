"""Debug levels and the DETAIL-mode collective fingerprint check.

``RINGTORCH_DEBUG=DETAIL`` (or torch's ``TORCH_DISTRIBUTED_DEBUG=DETAIL``) makes every rank
compare, before each collective, a fingerprint of what it is about to run: the group's
sequence number, the operation, and the shapes and dtypes of its tensors, as torch's
``ProcessGroupWrapper`` does. A mismatch raises on every rank with every rank's fingerprint,
instead of a hang or silently wrong numbers; a rank that never arrives is named when the
group's timeout passes. The fingerprints travel through the group's own store (keys
``rt_fp/<seq>/<rank>``, deleted by the last rank to read them), not the data path.

Even without DETAIL the native backend checks every frame's header (op, dtype, size,
sequence number); DETAIL adds shapes and catches a mismatch before any data moves.
"""

from __future__ import annotations

import enum
import json
import os
import pdb
import sys
import traceback
from datetime import timedelta
from typing import Any

import torch

from ringtorch import _config
from ringtorch._errors import DistBackendError
from ringtorch.collectives.reports import fingerprint_mismatch, fingerprint_missing


class DebugLevel(enum.Enum):
    """torch's ``DebugLevel``: OFF, INFO or DETAIL."""

    OFF = 0
    INFO = 1
    DETAIL = 2


_level: DebugLevel | None = None


def _parse(text: str) -> DebugLevel:
    value = text.strip().upper() or "OFF"
    if value not in DebugLevel.__members__:
        raise ValueError(f"debug level must be OFF, INFO or DETAIL, got {text!r}")
    return DebugLevel[value]


def get_debug_level() -> DebugLevel:
    """The debug level: set by :func:`set_debug_level`, else ``RINGTORCH_DEBUG``, else
    torch's ``TORCH_DISTRIBUTED_DEBUG``, else OFF."""
    if _level is not None:
        return _level
    ours = _config.DEBUG.get()
    if ours and ours != "OFF":
        return _parse(ours)
    return _parse(os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF"))


def set_debug_level(level: DebugLevel) -> None:
    """Set the debug level for groups created from now on."""
    global _level
    if not isinstance(level, DebugLevel):
        raise TypeError(f"expected a DebugLevel, got {level!r}")
    _level = level


def set_debug_level_from_env() -> None:
    """Forget :func:`set_debug_level`'s value: read the environment again."""
    global _level
    _level = None


def install(pg: Any) -> None:
    """Give ``pg`` the fingerprint check when the debug level is DETAIL."""
    if get_debug_level() is DebugLevel.DETAIL:
        pg.collective_check = check_fingerprint


def _type_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_fingerprint(pg: Any, call: Any, tensors: list[tuple[tuple[int, ...], torch.dtype]],
                      ) -> None:
    """Compare the fingerprint of ``call`` (a CollectiveCall named by the facade's op) with
    every other rank's; raise on a mismatch.

    Raises:
        DistBackendError: ranks disagree (the message shows each rank's fingerprint and what
            differs), or some rank did not reach this collective before its deadline.
    """
    import time

    seq, op_name, deadline = call.seq, call.op, call.deadline
    store = pg.get_group_store()
    rank, size = pg.rank(), pg.size()
    mine = {"seq": seq, "op": op_name.upper(), "shapes": [list(s) for s, _ in tensors],
            "dtypes": [_type_name(d) for _, d in tensors]}
    prefix = f"rt_fp/{seq}/"
    keys = [f"{prefix}{r}" for r in range(size)]
    store.set(keys[rank], json.dumps(mine))
    remaining = max(0.001, deadline - time.monotonic())
    try:
        store.wait(keys, timedelta(seconds=remaining))
    except Exception as exc:
        missing = [r for r in range(size) if not store.check([keys[r]])]
        raise DistBackendError(fingerprint_missing(call, missing, remaining, exc)) from None
    entries = [json.loads(store.get(k)) for k in keys]
    if store.add(f"{prefix}read", 1) == size:
        for key in [*keys, f"{prefix}read"]:
            store.delete_key(key)
    for other, entry in enumerate(entries):
        if entry != mine:
            raise DistBackendError(fingerprint_mismatch(rank, mine, other, entry))


_breakpoint_counts: dict[int, int] = {}


class _DistributedPdb(pdb.Pdb):
    """A pdb that reads this process's /dev/stdin (a worker's stdin is not the terminal)."""

    def interaction(self, *args: Any, **kwargs: Any) -> None:
        saved = sys.stdin
        try:
            with open("/dev/stdin") as sys.stdin:
                pdb.Pdb.interaction(self, *args, **kwargs)
        finally:
            sys.stdin = saved


def breakpoint(rank: int = 0, skip: int = 0, timeout_s: float | None = 3600) -> None:
    """Stop rank ``rank`` in pdb while the other ranks wait in a barrier (torch's
    ``dist.breakpoint``); the first ``skip`` hits of this call site are ignored.

    While it runs, every group's timeout is raised to ``timeout_s`` so that the debugging
    session does not time the job out.
    """
    from ringtorch.distributed import _world, groups, ops

    if skip > 0:
        key = hash("".join(traceback.format_stack()[:-1]))
        count = _breakpoint_counts.get(key, 0) + 1
        _breakpoint_counts[key] = count
        if count <= skip:
            return
    if timeout_s is not None:
        for pg in list(_world._world.pg_map):
            pg.set_timeout(timedelta(seconds=timeout_s))
    if groups.get_rank() == rank:
        debugger = _DistributedPdb()
        debugger.message(f"\n!!! ATTENTION !!!\n\nType 'up' to get to the frame that called "
                         f"dist.breakpoint(rank={rank})\n")
        debugger.set_trace(sys._getframe(1))
    ops.barrier()


__all__ = ["DebugLevel", "breakpoint", "check_fingerprint", "get_debug_level", "install",
           "set_debug_level", "set_debug_level_from_env"]

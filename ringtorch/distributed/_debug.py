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
    try:
        values = store.multi_get(keys)  # one round trip, whatever the group's size
    except NotImplementedError:  # a user's store that only implements get
        values = [store.get(k) for k in keys]
    entries = [json.loads(v) for v in values]
    if store.add(f"{prefix}read", 1) == size:
        for key in [*keys, f"{prefix}read"]:
            store.delete_key(key)
    for other, entry in enumerate(entries):
        if entry != mine:
            raise DistBackendError(fingerprint_mismatch(rank, mine, other, entry))


__all__ = ["DebugLevel", "check_fingerprint", "get_debug_level", "install",
           "set_debug_level", "set_debug_level_from_env"]

"""torch's option structs and ReduceOps, translated into the engine's.

torch hands a process group mutable C++ option objects (``AllreduceOptions`` with its
``reduceOp``, ``timeout``, ``asyncOp``); the engine takes frozen dataclasses with the same
field names. A translation reads each field the engine has, so the engine never holds an
object torch may change after the call. torch's "no timeout given" (a negative timeout) means
the group's own timeout, as it does for gloo.

Translating is on every call's path, and reading a C++ struct's fields from Python is slow:
the fields to read are worked out once per pair of classes, and equal translations share one
frozen instance (a small cache), so a call costs a few attribute reads and a dict lookup.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from ringtorch.collectives.reduce_op import RedOpType, make_premul_sum

_ZERO = timedelta(0)


def reduce_op(op: Any) -> Any:
    """The engine's ReduceOp for torch's (a member, or an instance with a PREMUL_SUM factor)."""
    kind = getattr(op, "op", op)
    try:
        member = _member(kind)
    except TypeError:  # unhashable: not a ReduceOp at all
        member = None
    if member is None:
        raise TypeError(f"expected a ReduceOp such as ReduceOp.SUM, got {op!r}")
    if member is RedOpType.PREMUL_SUM:
        factor = getattr(op, "factor", None)
        if factor is None:
            raise ValueError("ReduceOp.PREMUL_SUM needs a factor: build it with "
                             "torch.distributed._make_nccl_premul_sum(factor)")
        return make_premul_sum(factor)
    return member


@functools.lru_cache(maxsize=32)
def _member(kind: Any) -> RedOpType | None:
    """The engine's RedOpType of torch's (matched by name), None for anything else."""
    name = getattr(kind, "name", None)
    return RedOpType[name] if isinstance(name, str) and name in RedOpType.__members__ else None


def timeout(opts: Any) -> timedelta | None:
    """The call's timeout, or None for the group's (torch's unset timeout is negative)."""
    value = getattr(opts, "timeout", None)
    if not isinstance(value, timedelta) or value <= _ZERO:
        return None
    return value


@functools.lru_cache(maxsize=64)
def _fields(kind: type, torch_kind: type) -> tuple[str, ...]:
    """The fields of the engine's ``kind`` that torch's ``torch_kind`` has (not timeout)."""
    probe = torch_kind()
    return tuple(name for name in kind.__dataclass_fields__
                 if name != "timeout" and hasattr(probe, name))


@functools.lru_cache(maxsize=256)
def _shared(kind: type, fields: tuple[tuple[str, Any], ...]) -> Any:
    return kind(**dict(fields))


def translate(kind: type, opts: Any, async_op: bool | None = None) -> Any:
    """An instance of the engine's option class ``kind`` with the fields of torch's ``opts``.

    ``async_op`` overrides ``opts.asyncOp`` (a coalesced block queues every operation).
    """
    fields: list[tuple[str, Any]] = [("timeout", timeout(opts))]
    shareable = True
    for name in _fields(kind, type(opts)):
        value = getattr(opts, name)
        if name == "reduceOp":
            value = reduce_op(value)
            shareable = isinstance(value, RedOpType)  # a PREMUL_SUM factor may be a tensor
        elif name == "asyncOp" and async_op is not None:
            value = async_op
        fields.append((name, value))
    if shareable:
        try:
            return _shared(kind, tuple(fields))
        except TypeError:  # an unhashable field (a barrier's device_ids list)
            pass
    return kind(**dict(fields))


__all__ = ["reduce_op", "timeout", "translate"]

"""torch's option structs and ReduceOps, translated into the engine's.

torch hands a process group mutable C++ option objects (``AllreduceOptions`` with its
``reduceOp``, ``timeout``, ``asyncOp``); the engine takes frozen dataclasses with the same
field names. A translation reads each field the engine has, so the engine never holds an
object torch may change after the call. torch's "no timeout given" (a negative timeout) means
the group's own timeout, as it does for gloo.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from ringtorch.collectives.reduce_op import RedOpType, ReduceOp, make_premul_sum


def reduce_op(op: Any) -> Any:
    """The engine's ReduceOp for torch's (a member, or an instance with a PREMUL_SUM factor)."""
    kind = getattr(op, "op", op)
    name = getattr(kind, "name", None)
    if not isinstance(name, str) or name not in RedOpType.__members__:
        raise TypeError(f"expected a ReduceOp such as ReduceOp.SUM, got {op!r}")
    if name == "PREMUL_SUM":
        factor = getattr(op, "factor", None)
        if factor is None:
            raise ValueError("ReduceOp.PREMUL_SUM needs a factor: build it with "
                             "torch.distributed._make_nccl_premul_sum(factor)")
        return make_premul_sum(factor)
    return ReduceOp(RedOpType[name])


def timeout(opts: Any) -> timedelta | None:
    """The call's timeout, or None for the group's (torch's unset timeout is negative)."""
    value = getattr(opts, "timeout", None)
    if not isinstance(value, timedelta) or value <= timedelta(0):
        return None
    return value


def translate(kind: type, opts: Any, async_op: bool | None = None) -> Any:
    """An instance of the engine's option class ``kind`` with the fields of torch's ``opts``.

    ``async_op`` overrides ``opts.asyncOp`` (a coalesced block queues every operation).
    """
    fields: dict[str, Any] = {"timeout": timeout(opts)}
    for name in kind.__dataclass_fields__:
        if name == "timeout" or not hasattr(opts, name):
            continue
        value = getattr(opts, name)
        fields[name] = reduce_op(value) if name == "reduceOp" else value
    if async_op is not None:
        fields["asyncOp"] = async_op
    return kind(**{k: v for k, v in fields.items() if k in kind.__dataclass_fields__})


__all__ = ["reduce_op", "timeout", "translate"]

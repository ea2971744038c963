"""The list forms of all_gather and reduce_scatter on the native backend: one tensor per rank,
moved in place where the transport can (shared memory), else through the base class's scratch
buffer.

The rule it keeps: a list form is the same collective as its one-tensor form on every rank (the
same call descriptor: op, dtype, byte count), so ranks may mix the forms; only where the bytes
land or come from differs. Methods of NativeBackend, kept here for its size budget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ringtorch._buffers import as_bytes
from ringtorch._observe.operation import Operation
from ringtorch.collectives.backends.base import Backend
from ringtorch.collectives.lowering import scale
from ringtorch.collectives.reduce_op import premul_factor

if TYPE_CHECKING:
    from ringtorch.collectives.backends.native import NativeBackend


def all_gather_parts(self: NativeBackend, outs: list[torch.Tensor], inp: torch.Tensor,
                     o: Operation) -> None:
    """See base class: straight into every part when the transport can."""
    parts = getattr(self.transport, "all_gather_parts", None)
    if parts is None or len(outs) != self.size:
        Backend.all_gather_parts(self, outs, inp, o)
        return
    inp_bytes = as_bytes(inp)
    call = self._calls("all_gather", o.seq, inp.dtype, None, -1, inp_bytes.nbytes, o.deadline)
    with self._enter(call, o):
        parts(call, [as_bytes(part) for part in outs], inp_bytes, inp.element_size())


def reduce_scatter_parts(self: NativeBackend, out: torch.Tensor, ins: list[torch.Tensor], op: Any,
                         o: Operation) -> None:
    """See base class: straight from every part when the transport can."""
    parts = getattr(self.transport, "reduce_scatter_parts", None)
    if parts is None or len(ins) != self.size:
        Backend.reduce_scatter_parts(self, out, ins, op, o)
        return
    low = self._lower(op, out.dtype, "reduce_scatter")
    factor = premul_factor(op) if low.scales else None
    nbytes = self.size * out.numel() * low.itemsize
    call = self._calls("reduce_scatter", o.seq, out.dtype, low.kind, -1, nbytes, o.deadline)
    with self._enter(call, o):
        if factor is not None:
            ins = [scale(i, factor, in_place=False) for i in ins]
        out_bytes = as_bytes(out)
        parts(call, out_bytes, [as_bytes(i) for i in ins], low.reducer, low.itemsize)
        if low.post is not None:
            low.post(out_bytes)


__all__ = ["all_gather_parts", "reduce_scatter_parts"]

"""torch.profiler ranges for collectives and point-to-point operations, as torch's own backends
record them: named "<backend>:<collective>" ("gloo:all_reduce"), or the name of the enclosing
``record_comm``, with the input tensors (their shapes, under ``record_shapes=True``) and the
sizes torch's ``record_param_comms`` reports as the range's arguments.

A range opens when the operation is issued and closes when it completes (on whichever thread
completes it), so an asynchronous operation's range covers its time in the queue, as torch's
does. The rule: nothing here runs unless a profiler is active; the group checks
``profiler_on()`` (one C call, ~60 ns) per operation and goes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._C._autograd import _profiler_enabled as profiler_on
from torch._C._profiler import _RecordFunctionFast

from ringtorch._observe.profiling import COMM_NAMES

# ProcessGroup method -> the collective's name in torch's profiler titles
_TITLES = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "allgather_coalesced": "all_gather",
    "all_gather_single": "all_gather", "reduce_scatter_single": "reduce_scatter",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all",
    "monitored_barrier": "barrier", "recv_anysource": "recvAnySource",
}


def title(backend_name: str, op_name: str) -> str:
    """The range's name: record_comm's name if one is in force, else "<backend>:<op>"."""
    named = COMM_NAMES.name
    if named is not None:
        return named
    return f"{backend_name}:{_TITLES.get(op_name, op_name)}"


def _nelems(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() for t in tensors)


def begin(backend_name: str, op_name: str, group: tuple[str, int, int],
          inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], peer: int = -1,
          recorded: Sequence[torch.Tensor] | None = None) -> Any:
    """Open the range of an operation being issued (call only when ``profiler_on()``);
    :func:`end` closes it. ``group``: its (name, this rank, size); ``recorded``: the tensors
    whose shapes the range records, as torch's does (``inputs`` when None)."""
    ins = [t for t in inputs if all(t is not o for o in outputs)] or list(outputs)
    dtype = outputs[0].dtype if outputs else (ins[0].dtype if ins else None)
    args: dict[str, Any] = {
        "Collective name": _TITLES.get(op_name, op_name),
        "Process Group Name": group[0], "Rank": group[1], "Group size": group[2],
        "In msg nelems": _nelems(ins),
        "Out msg nelems": _nelems(outputs),
        "dtype": "" if dtype is None else str(dtype).removeprefix("torch."),
        "nbytes": sum(t.numel() * t.element_size() for t in outputs),
    }
    if peer >= 0:
        args["Peer"] = peer
    span = _RecordFunctionFast(title(backend_name, op_name),
                               list(inputs if recorded is None else recorded), args)
    span.__enter__()
    return span


def end(span: Any) -> None:
    """Close a range :func:`begin` opened; never raises (it runs as the operation completes)."""
    try:
        span.__exit__(None, None, None)
    except Exception:  # the profiler may have stopped meanwhile
        pass


__all__ = ["begin", "end", "profiler_on", "title"]

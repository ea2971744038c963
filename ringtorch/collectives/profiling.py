"""torch.profiler ranges for collectives and point-to-point operations, as torch's own backends
record them: named "<backend>:<collective>" ("gloo:all_reduce"), or the name of the enclosing
``record_comm``, asynchronous, with the input tensors (their shapes, under
``record_shapes=True``); and, at issue, a zero-length range named ``PARAMS`` with the sizes
torch's ``record_param_comms`` reports as its arguments (that name itself makes torch's
profiler read C++ data that only its own backends attach, and crash without it).

A range opens when the operation is issued and closes when it completes (on whichever thread
completes it), so an asynchronous operation's range covers its time in the queue, as torch's
does, and ends at its completion, not when someone waits for it.

Every range is asynchronous (``is_async`` in torch.profiler's events), as torch's gloo's are.
torch's backends mark their ranges so in C++ (``RecordFunction::_setAsync``), out of Python's
reach, but torch.profiler also counts as asynchronous a range that closes on another thread
than the one that opened it: so while a profiler is active a group runs every operation on
its lane's thread, synchronous ones too (the caller waits for it, as torch's callers wait
for gloo's worker threads). Closing a range on another thread needs the profiler's
thread-local state there: a ``_RecordFunctionFast`` closed on another thread is never seen
closed (the profiler ends it when it stops), so the range is torch's own asynchronous kind,
ended by ``torch.ops.profiler._call_end_callbacks_on_jit_fut`` when a future completes (what
``record_function._call_end_callbacks_on_future`` and torch's RPC use). That kind of range
carries positional inputs only, hence the sizes in the separate ``PARAMS`` range.
A torch without those operators gets ``_RecordFunctionFast`` ranges, not asynchronous.

The rule: nothing here runs unless a profiler is active; the group checks ``profiler_on()``
(one C call, ~60 ns) per operation and goes on, and runs synchronous operations on the
calling thread as it does without one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch._C._autograd import _profiler_enabled as profiler_on
from torch._C._profiler import _RecordFunctionFast

from ringtorch._observe.profiling import COMM_NAMES

# The zero-length range that carries an operation's sizes (see the module docstring).
PARAMS = "ringtorch:comm_params"

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
    shown = list(inputs if recorded is None else recorded)
    if _enter is None:  # a torch without the asynchronous ranges' operators
        span = _RecordFunctionFast(title(backend_name, op_name), shown, args)
        span.__enter__()
        return span
    done = torch.futures.Future()
    _end_on(_enter(title(backend_name, op_name), *shown), done)
    with _RecordFunctionFast(PARAMS, [], args):  # inside the operation's range
        pass
    return done


def end(span: Any) -> None:
    """Close a range :func:`begin` opened; never raises (it runs as the operation completes)."""
    try:
        if isinstance(span, torch.futures.Future):
            span.set_result(None)  # runs the profiler's end of the range, on this thread
        else:
            span.__exit__(None, None, None)
    except Exception:  # the profiler may have stopped meanwhile
        pass


def _operators() -> tuple[Any, Any]:
    """(open a range with inputs, end it when a future completes), or (None, None) where
    this torch lacks them."""
    try:
        from torch.autograd import _record_function_with_args_enter

        return _record_function_with_args_enter, torch.ops.profiler._call_end_callbacks_on_jit_fut
    except (ImportError, AttributeError, RuntimeError):
        return None, None


_enter, _end_on = _operators()


__all__ = ["PARAMS", "begin", "end", "profiler_on", "title"]

"""The reducing collectives of a ProcessGroup: all_reduce, reduce, reduce_scatter.

Each method checks its arguments (torch's gloo messages, checks.py), checks the reduction
against the dtype (reduce_op.check_reduce_op) and stages its tensors (_buffers.py) before
anything is submitted; the backend then reduces in a fixed order, so every rank gets the
same bits.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from ringtorch import _buffers
from ringtorch._observe.operation import Operation
from ringtorch.collectives import checks
from ringtorch.collectives.group_base import GroupBase
from ringtorch.collectives.options import (
    AllreduceCoalescedOptions,
    AllreduceOptions,
    ReduceOptions,
    ReduceScatterOptions,
)
from ringtorch.collectives.reduce_op import RedOpType, ReduceOp, check_reduce_op
from ringtorch.collectives.work import Work, joined_work

_VALID: set[tuple[object, object, str]] = set()


def _check_op(op: object, dtype: object, name: str) -> None:
    """check_reduce_op, remembering the (member, dtype) pairs already found valid (ReduceOp
    instances, e.g. PREMUL_SUM with a factor, are checked every time)."""
    key = (op, dtype, name)
    if type(op) is RedOpType and key in _VALID:
        return
    check_reduce_op(op, dtype, name)
    if type(op) is RedOpType:
        _VALID.add(key)


def _readable_apart(flat_in: torch.Tensor, flat_out: torch.Tensor) -> torch.Tensor:
    """A reduce-scatter's input as the backend gets it: the caller's memory itself (backends
    only read their input; no copy on the common path), or a private copy when it overlaps
    the output (the backend would overwrite what it still has to read)."""
    return flat_in.clone() if _buffers.overlaps(flat_in, flat_out) else flat_in


class ReductionOps(GroupBase):
    """allreduce, allreduce_coalesced, reduce, reduce_scatter and their single-tensor forms."""

    def allreduce(self, tensors: Any, opts: Any = None, timeout: timedelta | None = None) -> Work:
        """Reduce ``tensors[0]`` across ranks with ``opts.reduceOp``, in place everywhere."""
        if not isinstance(tensors, (list, tuple)):
            tensors = [tensors]
        if not isinstance(opts, AllreduceOptions):
            opts = AllreduceOptions(reduceOp=opts if opts is not None else ReduceOp.SUM,
                                    timeout=timeout)
        t = checks.single("allreduce", tensors)
        _check_op(opts.reduceOp, t.dtype, "all_reduce")
        staged = _buffers.Staged(t, read=True, write=True)
        op = opts.reduceOp

        def run(o: Operation) -> None:
            self._backend_or_raise().all_reduce(staged.flat, op, o)
            staged.finish()

        return self._collective("allreduce", opts, run, [t], [t])

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Work:
        """All-reduce several tensors of one dtype as one buffer (one collective)."""
        opts = opts if opts is not None else AllreduceCoalescedOptions()
        ts = checks.tensors("allreduce_coalesced", tensors)
        checks.same_dtype("allreduce_coalesced", ts, ts[0].dtype)
        _check_op(opts.reduceOp, ts[0].dtype, "all_reduce")
        flat, finish = _buffers.pack(ts, read=True)
        op = opts.reduceOp

        def run(o: Operation) -> None:
            self._backend_or_raise().all_reduce(flat, op, o)
            finish()

        return self._collective("allreduce_coalesced", opts, run, ts, ts)

    def reduce(self, tensors: Any, opts: Any = None, op: Any = ReduceOp.SUM,
               timeout: timedelta | None = None) -> Work:
        """Reduce across ranks into root's tensor (``opts.rootRank``)."""
        if not isinstance(tensors, (list, tuple)):
            opts = ReduceOptions(reduceOp=op, rootRank=opts if opts is not None else 0,
                                 timeout=timeout)
            tensors = [tensors]
        opts = opts if opts is not None else ReduceOptions()
        t = checks.single("reduce", tensors)
        root = checks.root("reduce", opts.rootRank, self._size)
        _check_op(opts.reduceOp, t.dtype, "reduce")
        is_root = self._rank == root
        staged = _buffers.Staged(t, read=True, write=is_root)
        red = opts.reduceOp

        def run(o: Operation) -> None:
            self._backend_or_raise().reduce(staged.flat, red, root, o)
            staged.finish()

        return self._collective("reduce", opts, run, [t], [t])

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None,
                       timeout: timedelta | None = None) -> Work:
        """Reduce input lists across ranks; rank r's output gets the reduction of element r."""
        if not isinstance(output_tensors, (list, tuple)):
            opts = ReduceScatterOptions(reduceOp=opts if opts is not None else ReduceOp.SUM,
                                        timeout=timeout)
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        opts = opts if opts is not None else ReduceScatterOptions()
        out = checks.single("reduce_scatter", output_tensors, "output tensor list")
        if not isinstance(input_tensors, (list, tuple)) or len(input_tensors) != 1:
            raise checks.fail("reduce_scatter", "requires a single-element input list")
        given = input_tensors[0]
        if not isinstance(given, (list, tuple)) or len(given) != self._size:
            raise RuntimeError("invalid input tensor list size, must be world size")
        ins = [checks.tensor("reduce_scatter", i) for i in given]
        checks.same_dtype("reduce_scatter", ins, out.dtype)
        checks.numel_matches("reduce_scatter", ins, out)
        _check_op(opts.reduceOp, out.dtype, "reduce_scatter")
        dst = _buffers.Staged(out, read=False, write=True)
        red = opts.reduceOp
        whole = _buffers.adjacent_flat(ins)
        if whole is not None:  # one buffer already: the one-tensor form
            flat_in = _readable_apart(whole, dst.flat)

            def run(o: Operation) -> None:
                self._backend_or_raise().reduce_scatter(dst.flat, flat_in, red, o)
                dst.finish()
        else:  # read from every part where it is (the backend's list form)
            parts = [_readable_apart(_buffers.Staged(i, read=True, write=False).flat, dst.flat)
                     for i in ins]

            def run(o: Operation) -> None:
                self._backend_or_raise().reduce_scatter_parts(dst.flat, parts, red, o)
                dst.finish()

        return self._collective("reduce_scatter", opts, run, [out, *ins], [out])

    def reduce_scatter_single(self, outputTensor: Any, inputTensor: Any,
                              opts: Any = None) -> Work:
        """Reduce ``inputTensor`` (size x output) across ranks; rank r gets slice r."""
        opts = opts if opts is not None else ReduceScatterOptions()
        out = checks.tensor("reduce_scatter_single", outputTensor)
        inp = checks.tensor("reduce_scatter_single", inputTensor)
        checks.same_dtype("reduce_scatter_single", [inp], out.dtype)
        if inp.numel() != out.numel() * self._size:
            raise checks.fail("reduce_scatter_single", "input tensor must be the same size as "
                                                       "output size times world size")
        _check_op(opts.reduceOp, out.dtype, "reduce_scatter")
        dst = _buffers.Staged(out, read=False, write=True)
        flat_in = _readable_apart(_buffers.Staged(inp, read=True, write=False).flat, dst.flat)
        red = opts.reduceOp

        def run(o: Operation) -> None:
            self._backend_or_raise().reduce_scatter(dst.flat, flat_in, red, o)
            dst.finish()

        return self._collective("reduce_scatter_single", opts, run, [out, inp], [out])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputTensors: Any, inputTensors: Any,
                                        opts: Any = None) -> Work:
        """Several ``reduce_scatter_single`` calls, run in order (one Work)."""
        opts = opts if opts is not None else ReduceScatterOptions()
        outs = checks.tensors("reduce_scatter_tensor_coalesced", outputTensors)
        ins = checks.tensors("reduce_scatter_tensor_coalesced", inputTensors)
        if len(outs) != len(ins):
            raise checks.fail("reduce_scatter_tensor_coalesced", "requires input/output "
                                                                 "tensor lists of equal length")
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outs, ins, strict=True)]
        return joined_work("reduce_scatter_tensor_coalesced", works, outs)


__all__ = ["ReductionOps"]

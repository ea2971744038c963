"""The data-moving collectives of a ProcessGroup: broadcast, gathers, scatter, all-to-all.

Each method checks its arguments (torch's gloo messages, checks.py) and stages its tensors
(_buffers.py: views where the memory allows, scratch copies for strided tensors, copied back
on completion) before anything is submitted. ``allgather`` also takes output lists of uneven
sizes, which torch documents and gloo rejects: it then runs as an all-to-all.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from ringtorch import _buffers
from ringtorch._observe.operation import Operation
from ringtorch.collectives import checks
from ringtorch.collectives.group_base import GroupBase, RunFn
from ringtorch.collectives.options import (
    AllgatherOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ScatterOptions,
)
from ringtorch.collectives.work import Work, joined_work


class MovementOps(GroupBase):
    """broadcast, allgather (all forms), gather, scatter, alltoall (both forms), barrier."""

    def broadcast(self, tensors: Any, opts: Any = None, timeout: timedelta | None = None) -> Work:
        """Broadcast root's tensor (``opts.rootTensor`` of ``tensors``) to every rank."""
        if not isinstance(tensors, (list, tuple)):
            opts = BroadcastOptions(rootRank=opts if opts is not None else 0, timeout=timeout)
            tensors = [tensors]
        opts = opts if opts is not None else BroadcastOptions()
        root = checks.root("broadcast", opts.rootRank, self._size)
        if type(tensors) is list and len(tensors) == 1 and opts.rootTensor == 0:
            ts = [checks.tensor("broadcast", tensors[0])]  # the usual case, kept short
        else:
            ts = checks.tensors("broadcast", tensors)
            if not 0 <= opts.rootTensor < len(ts):
                raise checks.fail("broadcast", f"invalid root tensor: {opts.rootTensor}")
            checks.type_and_sizes_match("broadcast", ts, ts[0])
        is_root = self._rank == root
        main = _buffers.Staged(ts[opts.rootTensor], read=is_root, write=not is_root)
        others = [t for i, t in enumerate(ts) if i != opts.rootTensor] if len(ts) > 1 else ()

        def run(o: Operation) -> None:
            self._backend_or_raise().broadcast(main.flat, root, o)
            main.finish()
            for t in others:
                t.copy_(ts[opts.rootTensor])

        return self._collective("broadcast", opts, run, ts, ts)

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Work:
        """Every rank's input into every rank's output list (uneven sizes allowed)."""
        if not isinstance(input_tensors, (list, tuple)):
            opts = AllgatherOptions(timeout=opts)
            output_tensors, input_tensors = [output_tensors], [input_tensors]
        opts = opts if opts is not None else AllgatherOptions()
        inp = checks.single("allgather", input_tensors, "input tensor list")
        if not isinstance(output_tensors, (list, tuple)) or len(output_tensors) != 1:
            raise checks.fail("allgather", "requires input/output tensor lists to have the "
                                           "same length")
        outs = output_tensors[0]
        if not isinstance(outs, (list, tuple)) or len(outs) != self._size:
            got = len(outs) if isinstance(outs, (list, tuple)) else type(outs).__name__
            raise checks.fail("allgather", f"invalid output tensor list at index 0 (expected "
                                           f"length {self._size}, got {got})")
        outs = [checks.tensor("allgather", o) for o in outs]
        checks.same_dtype("allgather", outs, inp.dtype)
        checks.numel_matches("allgather", [outs[self._rank]], inp)
        run = self._gather_plan(outs, inp)
        return self._collective("allgather", opts, run, outs, outs,  # inputs may differ in size
                                recorded=[inp])

    def _gather_plan(self, outs: list[torch.Tensor], inp: torch.Tensor) -> RunFn:
        """How to all-gather ``inp`` into ``outs``: one all_gather when every part has the
        same size (into the parts themselves: one buffer when they lie back to back, else
        the backend's list form), else an all_to_all that sends this rank's part to every
        rank."""
        src = _buffers.Staged(inp, read=True, write=False)
        n = src.flat.numel()
        if all(o.numel() == inp.numel() for o in outs):
            whole = _buffers.adjacent_flat(outs)
            if whole is not None:
                def run(o: Operation) -> None:
                    self._backend_or_raise().all_gather(whole, src.flat, o)
                return run
            parts = [_buffers.Staged(o, read=False, write=True) for o in outs]

            def run_parts(o: Operation) -> None:
                self._backend_or_raise().all_gather_parts([p.flat for p in parts], src.flat, o)
                for p in parts:
                    p.finish()
            return run_parts
        flat, finish = _buffers.pack(outs, read=False)
        counts = [_buffers.real_view(o).numel() for o in outs]

        def run_uneven(o: Operation) -> None:
            repeated = src.flat.repeat(self._size)
            self._backend_or_raise().all_to_all(flat, repeated, counts, [n] * self._size,
                                                o)
            finish()
        return run_uneven

    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> Work:
        """Every rank's ``input`` concatenated (or stacked) into ``output``."""
        opts = opts if opts is not None else AllgatherOptions()
        out = checks.tensor("all_gather_single", output)
        inp = checks.tensor("all_gather_single", input)
        checks.same_dtype("all_gather_single", [out], inp.dtype)
        if out.numel() != inp.numel() * self._size:
            raise checks.fail("all_gather_single", "output tensor size must be equal to "
                                                   "world_size times input tensor size")
        src = _buffers.Staged(inp, read=True, write=False)
        dst = _buffers.Staged(out, read=False, write=True)

        def run(o: Operation) -> None:
            self._backend_or_raise().all_gather(dst.flat, src.flat, o)
            dst.finish()

        return self._collective("all_gather_single", opts, run, [inp, out], [out],
                                recorded=[inp])

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists: Any, input_list: Any, opts: Any = None) -> Work:
        """Several all-gathers as one: ``output_lists[r][i]`` receives rank r's input i."""
        opts = opts if opts is not None else AllgatherOptions()
        ins = checks.tensors("allgather_coalesced", input_list, "input tensor list")
        checks.same_dtype("allgather_coalesced", ins, ins[0].dtype)
        if not isinstance(output_lists, (list, tuple)) or len(output_lists) != self._size:
            raise checks.fail("allgather_coalesced", "invalid output tensor list: it must "
                                                     "hold one list per rank")
        outs = [[checks.tensor("allgather_coalesced", t) for t in lst] for lst in output_lists]
        for lst in outs:
            if len(lst) != len(ins):
                raise checks.fail("allgather_coalesced", "invalid output tensor list: each "
                                                         "must hold one tensor per input")
            for o, i in zip(lst, ins, strict=True):
                if o.numel() != i.numel() or o.dtype != i.dtype:
                    raise checks.fail("allgather_coalesced", f"invalid tensor size or type "
                                      f"(expected {checks.shape(i)} {i.dtype}, got "
                                      f"{checks.shape(o)} {o.dtype})")
        packed_in, _ = _buffers.pack(ins, read=True)
        total = packed_in.numel()
        gathered = torch.empty(total * self._size, dtype=packed_in.dtype)

        def run(o: Operation) -> None:
            self._backend_or_raise().all_gather(gathered, packed_in, o)
            for r, lst in enumerate(outs):
                _buffers.unpack(gathered[r * total:(r + 1) * total], lst)

        flat_outs = [t for lst in outs for t in lst]
        return self._collective("allgather_coalesced", opts, run, [*ins], flat_outs)

    def allgather_into_tensor_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Work:
        """Several ``all_gather_single`` calls, each run in order (one Work)."""
        opts = opts if opts is not None else AllgatherOptions()
        outs = checks.tensors("allgather_into_tensor_coalesced", outputs)
        ins = checks.tensors("allgather_into_tensor_coalesced", inputs)
        if len(outs) != len(ins):
            raise checks.fail("allgather_into_tensor_coalesced", "requires input/output "
                                                                 "tensor lists of equal length")
        works = [self.all_gather_single(o, i, AllgatherOptions(timeout=opts.timeout,
                                                                asyncOp=opts.asyncOp))
                 for o, i in zip(outs, ins, strict=True)]
        return joined_work("allgather_into_tensor_coalesced", works, outs)

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None,
               timeout: timedelta | None = None) -> Work:
        """Every rank's input into root's output list (``opts.rootRank``)."""
        if not isinstance(input_tensors, (list, tuple)):
            opts = GatherOptions(rootRank=opts if opts is not None else 0, timeout=timeout)
            input_tensors = [input_tensors]
            output_tensors = [output_tensors] if output_tensors else []
        opts = opts if opts is not None else GatherOptions()
        inp = checks.single("gather", input_tensors, "input list")
        root = checks.root("gather", opts.rootRank, self._size)
        outs: list[torch.Tensor] = []
        if self._rank == root:
            if not isinstance(output_tensors, (list, tuple)) or len(output_tensors) != 1:
                raise checks.fail("gather", "requires a single-element output list containing "
                                            f"a list with {self._size} tensors.")
            given = output_tensors[0]
            if not isinstance(given, (list, tuple)) or len(given) != self._size:
                got = len(given) if isinstance(given, (list, tuple)) else type(given).__name__
                raise checks.fail("gather", f"Incorrect output list size {got}. Output list "
                                  f"size should be {self._size}, same as size of the process "
                                  f"group.")
            outs = [checks.tensor("gather", o) for o in given]
            checks.same_dtype("gather", outs, inp.dtype)
            checks.numel_matches("gather", outs, inp)
        elif output_tensors:
            raise checks.fail("gather", "requires empty output on non-root")
        src = _buffers.Staged(inp, read=True, write=False)
        flat, finish = _buffers.pack(outs, read=False) if outs else (None, _nothing)

        def run(o: Operation) -> None:
            self._backend_or_raise().gather(flat, src.flat, root, o)
            finish()

        return self._collective("gather", opts, run, [inp], outs)

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None,
                timeout: timedelta | None = None) -> Work:
        """Root's input list (``opts.rootRank``) scattered: rank r gets element r."""
        if not isinstance(output_tensors, (list, tuple)):
            opts = ScatterOptions(rootRank=opts if opts is not None else 0, timeout=timeout)
            output_tensors = [output_tensors]
            input_tensors = [input_tensors] if input_tensors else []
        opts = opts if opts is not None else ScatterOptions()
        out = checks.single("scatter", output_tensors, "output list")
        root = checks.root("scatter", opts.rootRank, self._size)
        ins: list[torch.Tensor] = []
        if self._rank == root:
            if not isinstance(input_tensors, (list, tuple)) or len(input_tensors) != 1:
                raise checks.fail("scatter", "requires a single-element input list containing "
                                             f"a list with {self._size} tensors")
            given = input_tensors[0]
            if not isinstance(given, (list, tuple)) or len(given) != self._size:
                got = len(given) if isinstance(given, (list, tuple)) else type(given).__name__
                raise checks.fail("scatter", f"Incorrect input list size {got}. Input list "
                                  f"size should be {self._size}, same as size of the process "
                                  f"group.")
            ins = [checks.tensor("scatter", i) for i in given]
            checks.same_dtype("scatter", ins, out.dtype)
            checks.numel_matches("scatter", ins, out)
        elif input_tensors:
            raise checks.fail("scatter", "requires empty input on non-root")
        dst = _buffers.Staged(out, read=False, write=True)
        flat = _buffers.pack(ins, read=True)[0] if ins else None

        def run(o: Operation) -> None:
            self._backend_or_raise().scatter(dst.flat, flat, root, o)
            dst.finish()

        return self._collective("scatter", opts, run, [out], [out], recorded=ins)

    def alltoall_base(self, output: Any, input: Any, output_split_sizes: Any = None,
                      input_split_sizes: Any = None, opts: Any = None) -> Work:
        """Rank r sends dim-0 slice j of ``input`` to rank j and receives into slice j."""
        if not isinstance(opts, AllToAllOptions):
            opts = AllToAllOptions(timeout=opts)
        out = checks.tensor("alltoall_base", output)
        inp = checks.tensor("alltoall_base", input)
        if not out.is_contiguous() or not inp.is_contiguous():
            raise ValueError("Tensors must be contiguous")
        checks.same_dtype("alltoall_base", [inp], out.dtype)
        out_r, in_r = _buffers.real_view(out), _buffers.real_view(inp)
        out_counts = checks.row_splits("alltoall_base", out_r, output_split_sizes or [],
                                       self._size, "output")
        in_counts = checks.row_splits("alltoall_base", in_r, input_split_sizes or [],
                                      self._size, "input")
        checks.self_split("alltoall_base", self._rank, out_counts, in_counts)
        flat_out, flat_in = out_r.view(-1), in_r.view(-1)

        def run(o: Operation) -> None:
            self._backend_or_raise().all_to_all(flat_out, flat_in, out_counts, in_counts,
                                                o)

        return self._collective("alltoall_base", opts, run, [out, inp], [out], shapes=False,
                                recorded=[inp])

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Work:
        """Rank r sends ``input_tensors[j]`` to rank j, which receives it in its list's slot r."""
        if not isinstance(opts, AllToAllOptions):
            opts = AllToAllOptions(timeout=opts)
        ins = checks.tensors("alltoall", input_tensors, "input tensor list")
        outs = checks.tensors("alltoall", output_tensors, "output tensor list")
        if len(ins) != self._size:
            raise checks.fail("alltoall", f"input tensor list size {len(ins)} does not match "
                                          f"world size {self._size}")
        if len(outs) != self._size:
            raise checks.fail("alltoall", f"output tensor list size {len(outs)} does not match "
                                          f"world size {self._size}")
        checks.same_dtype("alltoall", ins + outs, ins[0].dtype)
        flat_in, _ = _buffers.pack(ins, read=True)
        flat_out, finish = _buffers.pack(outs, read=False)
        in_counts = [_buffers.real_view(t).numel() for t in ins]
        out_counts = [_buffers.real_view(t).numel() for t in outs]
        checks.self_split("alltoall", self._rank, out_counts, in_counts)

        def run(o: Operation) -> None:
            self._backend_or_raise().all_to_all(flat_out, flat_in, out_counts, in_counts,
                                                o)
            finish()

        return self._collective("alltoall", opts, run, ins + outs, outs, shapes=False,
                                recorded=ins)

    def barrier(self, opts: Any = None) -> Work:
        """Complete once every rank of the group has entered the barrier."""
        if not isinstance(opts, BarrierOptions):
            opts = BarrierOptions(timeout=opts)

        def run(o: Operation) -> None:
            self._backend_or_raise().barrier(o)

        return self._collective("barrier", opts, run, [], [])

    # -- how work runs ----------------------------------------------------------------------


def _nothing() -> None:
    return None


__all__ = ["MovementOps"]

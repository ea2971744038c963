"""The Reducer: averages DDP's gradients bucket by bucket while backward is still running.

Each parameter gets a hook that fires once its gradient has been accumulated
(``register_post_accumulate_grad_hook``). The hook copies the gradient, divided by the world
size, into its slot of a flat bucket buffer (or, with ``gradient_as_bucket_view``, makes
``param.grad`` that slot, so nothing is copied); when a bucket's last slot is filled, the
bucket's asynchronous all_reduce (or comm hook) is launched at once, so communication overlaps
the rest of backward. When the last bucket is launched, a callback queued on the autograd engine
runs as backward finishes: it waits for every bucket and writes the averages into ``param.grad``.

Guarantees (docs/design/ddp-buckets.md): buckets are launched in the same order on every rank
(bucket ``k`` only after buckets ``0..k-1``), whatever order the gradients arrive in; when
``backward()`` returns, every gradient is the group average; a parameter that got no gradient
makes the next iteration fail with torch's error, naming the parameter, unless
``find_unused_parameters=True``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd import Variable

from ringtorch import distributed as dist
from ringtorch._device import place
from ringtorch.distributed import GradBucket
from ringtorch.nn.parallel._ddp_trace import BackwardTrace
from ringtorch.nn.parallel.buckets import BucketPlan

# GradBucket (what hooks get) is ringtorch.distributed's, as torch's is torch.distributed's
__all__ = ["GradBucket", "Reducer"]

_SMALL_PARAM_NUMEL = 16384  # below this many elements per parameter a bucket is AVG-reduced
# Smaller buckets stay private: a shared-memory all_reduce takes 3 rounds where a small copy-in
# one takes 1 (measured 43-54 us against 24-30 us at 64 KiB; faster from about 1 MiB up).
SHARED_BUCKET_MIN_BYTES = 1 << 20

_UNUSED_PARAMS_ERROR = (
    "Expected to have finished reduction in the prior iteration before starting a new one. "
    "This error indicates that your module has parameters that were not used in producing "
    "loss. You can enable unused parameter detection by passing the keyword argument "
    "`find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel`, and by \n"
    "making sure all `forward` function outputs participate in calculating loss. \n"
    "If you already have done the above, then the distributed data parallel module wasn't able "
    "to locate the output tensors in the return value of your module's `forward` function. "
    "Please include the loss function and the structure of the return value of `forward` of "
    "your module when reporting this issue (e.g. list, dict, iterable).\n"
    "Parameters which did not receive grad for rank {rank}: {names}\n"
    "Parameter indices which did not receive grad for rank {rank}: {indices}")

_READY_TWICE_ERROR = (
    "Expected to mark a variable ready only once. This error is caused by one of the following "
    "reasons: 1) Use of a module parameter outside the `forward` function. 2) Reused parameters "
    "in multiple reentrant backward passes. 3) Incorrect unused parameter detection. "
    "Parameter at index {index} with name {name} has been marked as ready twice. This means "
    "that multiple autograd engine hooks have fired for this particular parameter during this "
    "iteration.")


class _Bucket:
    """One bucket's flat buffer, its parameters' views into it and this iteration's state."""

    def __init__(self, plan: BucketPlan, params: Sequence[torch.Tensor],
                 allocate: Callable[[int, torch.dtype], torch.Tensor] | None) -> None:
        self.indices = plan.indices
        self.offsets = plan.offsets
        self.params = [params[i] for i in plan.indices]
        first = self.params[0]
        # parameters in the simulated runtime's device memory: the bucket too (on CUDA,
        # torch.zeros on the parameters' device already is), so it takes the device path
        rt = place.runtime_of((first,))
        self.sim = rt if place.is_sim(rt) else None
        # `allocate` (the group's shared_tensor) puts the buffer in the group's shared memory,
        # whose all_reduce needs no copy in; it gives an ordinary tensor where that is off
        self.shared = allocate is not None and first.device.type == "cpu" and self.sim is None
        if self.sim is not None:
            self.buffer = place.zeros(self.sim, plan.numel, first.dtype, 0)
        else:
            self.buffer = (allocate(plan.numel, first.dtype)
                           if self.shared and allocate is not None
                           else torch.zeros(plan.numel, dtype=first.dtype, device=first.device))
        self.views = [self.buffer[off:off + p.numel()].view(p.shape)
                      for off, p in zip(plan.offsets, self.params, strict=True)]
        self.pending = len(self.indices)
        self.solo = len(self.indices) == 1
        # reduced with AVG instead of divided while copied in: one-parameter buckets (the
        # gradient is reduced where it lies) and buckets of small parameters, where a call per
        # parameter costs more (torch.div ~5 us against copy_ ~1.5 us) than one division of
        # the whole bucket, still in cache, after the all_reduce
        self.by_avg = self.solo or plan.numel < _SMALL_PARAM_NUMEL * len(self.indices)
        self.comm: _Pending | None = None
        # A one-parameter bucket may be reduced in the gradient itself (see _mark_ready):
        # then `direct` is that gradient, flattened, for this iteration.
        self.direct: torch.Tensor | None = None

    def comm_buffer(self) -> torch.Tensor:
        """The tensor this iteration's collective reduces."""
        return self.buffer if self.direct is None else self.direct


def _reducible_in_place(grad: torch.Tensor | None, buffer: torch.Tensor) -> bool:
    """Whether ``grad`` can itself be the all_reduce buffer of a one-parameter bucket."""
    return (grad is not None and grad.layout == torch.strided and grad.is_contiguous()
            and grad.dtype == buffer.dtype and grad.device == buffer.device
            and not grad.requires_grad)


def _is_view_of(grad: torch.Tensor | None, view: torch.Tensor) -> bool:
    return (grad is not None and grad.data_ptr() == view.data_ptr()
            and grad.shape == view.shape and grad.stride() == view.stride())


class Reducer:
    """Buckets, hooks and the per-iteration state of gradient averaging for one DDP module."""

    def __init__(self, params: Sequence[torch.Tensor], names: Sequence[str],
                 plans: Sequence[BucketPlan], process_group: Any, find_unused_parameters: bool,
                 gradient_as_bucket_view: bool) -> None:
        self._params = list(params)
        self._names = list(names)
        self._group = process_group
        self._rank = dist.get_rank(process_group)
        self._world_size = dist.get_world_size(process_group)
        self._find_unused = find_unused_parameters
        self._as_view = gradient_as_bucket_view
        # Buffers in shared memory where the group has it, for every bucket of 1 MiB or more
        # whose gradients are copied in anyway: all of them with gradient_as_bucket_view, else
        # those of several parameters (one-parameter buckets are reduced in the gradient
        # itself, _mark_ready). The same buckets on every rank, so every rank takes the same
        # all_reduce path.
        allocate = _shared_allocator(process_group)
        self._buckets = [_Bucket(plan, self._params,
                                 allocate if (gradient_as_bucket_view or len(plan.indices) > 1)
                                 and plan.numel * self._params[plan.indices[0]].element_size()
                                 >= SHARED_BUCKET_MIN_BYTES else None)
                         for plan in plans]
        self._locator = {index: (b, pos) for b, bucket in enumerate(self._buckets)
                         for pos, index in enumerate(bucket.indices)}
        self._comm_hook: tuple[Callable[..., Any], Any] | None = None
        self._static_unused: list[int] | None = None
        self.static_graph = False
        self._expect_hooks = False
        self._require_finalize = False
        self._ready = [False] * len(self._params)
        self._next_bucket = 0
        self._unused: list[int] = []
        self._marked_unused = False
        self._used_map = torch.zeros(len(self._params), dtype=torch.int32)
        # parameters that got a gradient since the last synced backward, no_sync() steps
        # included (torch's local_used_map): all_reduced into _used_map at the synced one
        self._used = [0] * len(self._params)
        self._div_factor: float = float(self._world_size)
        self._count_work: Any = None
        self._in_join = False
        self._trace: BackwardTrace | None = None  # this iteration's timeline, when tracing
        # buckets whose by_avg is set are all_reduced with AVG (the backend divides the sum,
        # right after copying it out); other buckets divide while copying into the bucket
        self._use_avg = False
        self._handles = [p.register_post_accumulate_grad_hook(self._make_hook(i))
                         for i, p in enumerate(self._params)]
        if gradient_as_bucket_view:
            for bucket in self._buckets:  # existing gradients move into the buckets now
                for param, view in zip(bucket.params, bucket.views, strict=True):
                    if param.grad is not None:
                        view.copy_(param.grad)
                        param.grad = view

    @property
    def buckets(self) -> list[list[int]]:
        """Parameter indices per bucket, in launch order (for tests and docs)."""
        return [list(b.indices) for b in self._buckets]

    def register_comm_hook(self, state: Any, hook: Callable[..., Any]) -> None:
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be "
                               "called once.")
        self._comm_hook = (hook, state)

    def set_forward_pass_work_handle(self, notified: Any,
                                     divide_by_initial_world_size: bool) -> None:
        """Under Join: ``notified`` is the Work of the all_reduce that counts the ranks still
        training (its ``result()[0]``); unless ``divide_by_initial_world_size``, gradients are
        divided by that count."""
        self._count_work = None if divide_by_initial_world_size else notified
        self._in_join = notified is not None

    def remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ---- per iteration -------------------------------------------------------------------

    def prepare_for_backward(self, outputs: Sequence[torch.Tensor]) -> None:
        """Arm the hooks for the coming backward; find unused parameters from ``outputs``.

        Raises:
            RuntimeError: the previous iteration's reduction never finished (torch's message,
                naming the parameters that got no gradient).
        """
        self.ensure_prior_reduction_finished()
        self._ready = [False] * len(self._params)
        self._next_bucket = 0
        for bucket in self._buckets:
            bucket.pending = len(bucket.indices)
            bucket.comm = None
            bucket.direct = None
        self._div_factor = float(self._world_size)
        # Under Join every rank sums (joined ranks shadow with zeros and SUM, training ranks
        # may divide by the count of ranks still training): AVG only outside Join.
        self._use_avg = self._comm_hook is None and not self._in_join
        self._expect_hooks = True
        self._require_finalize = True
        self._trace = BackwardTrace.if_tracing(self._buckets)
        self._marked_unused = False
        if self._find_unused:
            if self._static_unused is not None:
                self._unused = self._static_unused
            else:
                self._unused = self._unreachable(outputs)
                if self.static_graph:
                    self._static_unused = self._unused

    def ensure_prior_reduction_finished(self) -> None:
        if not self._require_finalize:
            return
        missing = [i for i, ready in enumerate(self._ready) if not ready]
        self._require_finalize = False
        self._expect_hooks = False
        raise RuntimeError(_UNUSED_PARAMS_ERROR.format(
            rank=self._rank, names=", ".join(sorted(self._names[i] for i in missing)),
            indices=" ".join(map(str, missing))))

    def _unreachable(self, outputs: Sequence[torch.Tensor]) -> list[int]:
        """Indices of parameters that no output's autograd graph reaches."""
        seen: set[Any] = set()
        reached: set[int] = set()
        stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            variable = getattr(node, "variable", None)
            if variable is not None:
                reached.add(id(variable))
            stack.extend(nxt for nxt, _ in node.next_functions if nxt is not None)
        return [i for i, p in enumerate(self._params) if id(p) not in reached]

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(_param: torch.Tensor) -> None:
            self._on_grad_ready(index)

        return hook

    def _on_grad_ready(self, index: int) -> None:
        # Counted under no_sync() too: a gradient accumulated there on one rank only is still
        # averaged at the next synced backward, so every rank ends with the same .grad.
        self._used[index] = 1
        if not self._expect_hooks:
            return  # no_sync(), or a backward that no DDP forward armed: accumulate locally
        if not self._marked_unused:
            self._marked_unused = True
            if self._trace:
                self._trace.begin()
            for unused in self._unused:
                self._mark_ready(unused, used=False)
        self._mark_ready(index, used=True)

    def _mark_ready(self, index: int, used: bool) -> None:
        if self._ready[index]:
            raise RuntimeError(_READY_TWICE_ERROR.format(index=index, name=self._names[index]))
        self._ready[index] = True
        if self._count_work is not None:  # Join without divide_by_initial_world_size
            self._div_factor = float(self._count_work.result()[0].item())
            self._count_work = None
        b, pos = self._locator[index]
        bucket = self._buckets[b]
        param = self._params[index]
        if used and bucket.solo and not self._as_view and bucket.sim is None \
                and _reducible_in_place(param.grad, bucket.buffer):
            # A bucket of one parameter is reduced in its gradient itself: no copy into the
            # bucket, none back. (Not for unused parameters, whose .grad must stay untouched.)
            bucket.direct = param.grad.view(-1)
            if self._comm_hook is None and not self._use_avg:
                bucket.direct.div_(self._div_factor)
        else:
            self._fill_slot(param, bucket.views[pos],
                            divide=self._comm_hook is None and not (bucket.by_avg and self._use_avg))
        bucket.pending -= 1
        if bucket.pending == 0:
            if self._trace:
                self._trace.bucket_ready(b)
            self._launch_ready_buckets()

    def _fill_slot(self, param: torch.Tensor, view: torch.Tensor, divide: bool) -> None:
        """Put the gradient in its slot, divided by the world size if ``divide`` (not when a
        comm hook divides, nor when the bucket's all_reduce is an AVG).

        With gradient_as_bucket_view, ``param.grad`` usually is the slot already (autograd
        accumulated into it); element-wise ops on exactly the same memory are safe in place.
        """
        grad = param.grad
        if grad is None:
            view.zero_()
            return
        if divide:
            torch.div(grad, self._div_factor, out=view)
        else:
            view.copy_(grad)
        if self._as_view and not _is_view_of(grad, view):
            param.grad = view

    def _launch_ready_buckets(self) -> None:
        last = len(self._buckets) - 1
        while self._next_bucket <= last and self._buckets[self._next_bucket].pending == 0:
            # The iteration's last collective is waited for right away: run it synchronously,
            # on this thread when the group is idle, which saves two thread wake-ups.
            self._launch(self._next_bucket,
                         wait_now=self._next_bucket == last and not self._find_unused)
            self._next_bucket += 1
        if self._next_bucket > last:
            if self._find_unused:
                self._used_map = torch.tensor(self._used, dtype=torch.int32)
                self._used = [0] * len(self._params)
                dist.all_reduce(self._used_map, group=self._group)
            Variable._execution_engine.queue_callback(self._finalize_backward)

    def _launch(self, b: int, wait_now: bool = False) -> None:
        bucket = self._buckets[b]
        if self._trace:
            self._trace.launching(b)
        if self._comm_hook is not None:
            hook, state = self._comm_hook
            bucket.comm = _Pending(future=hook(state, self.grad_bucket(b, bucket.comm_buffer())))
        else:
            op = dist.ReduceOp.AVG if bucket.by_avg and self._use_avg else dist.ReduceOp.SUM
            if wait_now:
                dist.all_reduce(bucket.comm_buffer(), op=op, group=self._group)
                bucket.comm = None
            else:
                bucket.comm = _Pending(work=dist.all_reduce(bucket.comm_buffer(), op=op,
                                                            group=self._group, async_op=True))
        if self._trace:
            self._trace.launched(b, bucket.comm)

    def grad_bucket(self, b: int, buffer: torch.Tensor) -> GradBucket:
        """The GradBucket a comm hook gets for bucket ``b``, its gradients viewing ``buffer``."""
        bucket = self._buckets[b]
        views = [buffer[off:off + p.numel()].view(p.shape)
                 for off, p in zip(bucket.offsets, bucket.params, strict=True)]
        return GradBucket(b, buffer, views, bucket.params, b == len(self._buckets) - 1)

    # ---- end of backward -----------------------------------------------------------------

    def _finalize_backward(self) -> None:
        if self._trace:
            self._trace.end()
        self._expect_hooks = False
        self._require_finalize = False
        for bucket in self._buckets:
            result = None if bucket.comm is None else bucket.comm.wait()
            place.fence(bucket.sim)  # simulated device memory: the host reads it next
            target = bucket.comm_buffer()
            if result is not None and result.data_ptr() != target.data_ptr():
                target.copy_(result.reshape(-1))
        globally_used = self._used_map.tolist() if self._find_unused else None
        for bucket in self._buckets:
            if bucket.direct is not None:
                continue  # reduced in the gradient itself
            for index, param, view in zip(bucket.indices, bucket.params, bucket.views,
                                          strict=True):
                if globally_used is not None and not globally_used[index]:
                    continue  # no rank produced a gradient: leave .grad as it is, like torch
                self._write_grad(param, view)
        if self._trace:
            self._trace.finalized()

    def _write_grad(self, param: torch.Tensor, view: torch.Tensor) -> None:
        if self._as_view:
            if param.grad is None:
                param.grad = view
            elif not _is_view_of(param.grad, view):
                raise RuntimeError(
                    "Detected at least one parameter gradient is not the expected DDP bucket "
                    "view with gradient_as_bucket_view=True. This may happen (for example) if "
                    "multiple allreduce hooks were registered onto the same parameter.")
        elif param.grad is None:
            param.grad = view.clone()
        else:
            param.grad.copy_(view)

    # ---- Join: shadow a backward pass with zeros -----------------------------------------

    def shadow_backward(self) -> None:
        """Issue, with zero gradients, the collectives a training rank's backward issues.

        A bucket in shared memory is reduced in its own buffer (zeroed, then restored), since
        the training ranks' all_reduce of it takes the shared-memory path, which every rank
        must take alike.
        """
        comms = []
        saved: list[tuple[torch.Tensor, torch.Tensor]] = []
        for b, bucket in enumerate(self._buckets):
            if bucket.shared:
                saved.append((bucket.buffer, bucket.buffer.clone()))
                zeros = bucket.buffer.zero_()
            else:
                zeros = place.zeros_like(bucket.buffer)  # in device memory where it is
            if self._comm_hook is None:
                comms.append(_Pending(work=dist.all_reduce(zeros, group=self._group,
                                                           async_op=True)))
            else:
                hook, state = self._comm_hook
                comms.append(_Pending(future=hook(state, self.grad_bucket(b, zeros))))
        if self._find_unused:
            comms.append(_Pending(work=dist.all_reduce(torch.zeros_like(self._used_map),
                                                       group=self._group, async_op=True)))
        for comm in comms:
            comm.wait()
        for buffer, content in saved:
            buffer.copy_(content)


def _shared_allocator(group: dist.ProcessGroup) -> Callable[[int, torch.dtype],
                                                             torch.Tensor] | None:
    """The group's ``shared_tensor(numel, dtype)`` where the group declares shared memory
    (``ProcessGroup.shares_memory``), else None (sockets, MPI, a custom backend)."""
    return group.shared_tensor if group.shares_memory else None


class _Pending:
    """A launched bucket reduction: a Work (plain all_reduce) or a comm hook's Future."""

    __slots__ = ("future", "work")

    def __init__(self, work: Any = None, future: Any = None) -> None:
        self.work = work
        self.future = future

    def wait(self) -> torch.Tensor | None:
        """Block until done; a hook's result tensor, or None when the buffer was reduced in place."""
        if self.work is not None:
            self.work.wait()
            return None
        value = self.future.wait()
        return value[0] if isinstance(value, (list, tuple)) else value

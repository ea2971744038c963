"""DistributedDataParallel: one process per replica, gradients averaged during backward.

torch's ``nn.parallel.DistributedDataParallel``, same constructor, attributes, errors and
behaviour, written over the public API of ``ringtorch.distributed`` (the rule this layer keeps:
it imports nothing else from ringtorch below ``distributed``). At construction the parameters'
shapes are checked across ranks and parameters and buffers are broadcast from rank 0; before
each forward the buffers are broadcast again (``broadcast_buffers``); during backward the
:class:`~ringtorch.nn.parallel.reducer.Reducer` all_reduces gradient buckets as they fill, so
that when ``backward()`` returns every ``.grad`` is the average over the group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from ringtorch import distributed as dist
from ringtorch._device import place
from ringtorch.distributed.algorithms.join import Join, Joinable, JoinHook
from ringtorch.nn.parallel.buckets import bucket_caps, plan_buckets
from ringtorch.nn.parallel.reducer import Reducer

__all__ = ["DistributedDataParallel"]

_BROADCAST_BUCKET_BYTES = 250 * 1024 * 1024


def _default_group() -> Any:
    if not dist.is_initialized():
        raise ValueError("Default process group has not been initialized, please make sure to "
                         "call init_process_group.")
    return dist.group.WORLD


def _find_tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside a forward's output (tensors, sequences, dicts, dataclasses)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _find_tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _find_tensors(item)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in _find_tensors(getattr(obj, f.name))]
    return []


def _move_to(obj: Any, device: torch.device) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_move_to(o, device) for o in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_move_to(o, device) for o in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _move_to(v, device)) for k, v in obj.items())
    return obj


class _DDPJoinHook(JoinHook):
    """Shadows one DDP iteration on a rank that has run out of inputs."""

    def __init__(self, ddp: DistributedDataParallel, divide_by_initial_world_size: bool) -> None:
        self.ddp = ddp
        ddp._divide_by_initial_world_size = divide_by_initial_world_size

    def main_hook(self) -> None:
        ddp = self.ddp
        if ddp.will_sync_module_buffers():
            ddp._sync_buffers(authoritative_candidate=False)
        should_sync = ddp._check_global_requires_backward_grad_sync(is_joined_rank=True)
        ddp.require_forward_param_sync = should_sync
        if should_sync:
            ddp.reducer.shadow_backward()

    def post_hook(self, is_last_joiner: bool) -> None:
        self.ddp._sync_final_model(is_last_joiner)


class DistributedDataParallel(nn.Module, Joinable):
    """Data parallelism across processes at the module level (torch's signature and semantics).

    Args:
        module: the module to replicate; its parameters must be on one device type.
        device_ids: None for CPU (and multi-device) modules, else the one CUDA device.
        output_device: the output's device for single-device CUDA modules.
        dim: kept for torch compatibility (inputs are not scattered).
        broadcast_buffers: broadcast buffers from rank 0 at construction and before each
            forward.
        init_sync: check parameter shapes across ranks and broadcast rank 0's state at
            construction.
        process_group: the group to average over (default: the default group).
        bucket_cap_mb: bucket size cap in MiB; None: 25 MiB, with a 1 MiB first bucket.
        find_unused_parameters: traverse the autograd graph after each forward so that
            parameters that get no gradient do not stall the reduction.
        check_reduction: deprecated in torch and ignored (a FutureWarning).
        gradient_as_bucket_view: make each ``.grad`` a view into its bucket (saves a copy and
            the memory of one copy of the gradients).
        static_graph: the set of used parameters never changes; found once, then reused.
    """

    def __init__(self, module: nn.Module, device_ids: Sequence[int | torch.device] | None = None,
                 output_device: int | torch.device | None = None, dim: int = 0,
                 broadcast_buffers: bool = True, init_sync: bool = True,
                 process_group: Any = None, bucket_cap_mb: float | None = None,
                 find_unused_parameters: bool = False, check_reduction: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False) -> None:
        super().__init__()
        Joinable.__init__(self)
        self.process_group = process_group if process_group is not None else _default_group()
        self.parameters_to_ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        named = [(n, p) for n, p in module.named_parameters() if n not in self.parameters_to_ignore]
        if not any(p.requires_grad for _, p in named):
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have "
                               "any parameter that requires a gradient.")
        self._check_devices(named, device_ids, output_device)
        for _, param in named:
            if isinstance(param, nn.parameter.UninitializedParameter):
                raise RuntimeError("Modules with uninitialized parameters can't be used with "
                                   "`DistributedDataParallel`. Run a dummy forward pass to "
                                   "correctly initialize the modules")
        _reject_sparse(module)
        if check_reduction:
            warnings.warn("The `check_reduction` argument in `DistributedDataParallel` module is "
                          "deprecated. Please avoid using it.", FutureWarning, stacklevel=2)
        self.dim = dim
        self.module = module
        self.device = named[0][1].device
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.static_graph = False
        self._divide_by_initial_world_size = True
        self.bucket_bytes_cap = bucket_caps(bucket_cap_mb)[1]
        self.broadcast_bucket_size = _BROADCAST_BUCKET_BYTES
        params, names = self._params_for_reducer()
        self._assign_modules_buffers()
        if init_sync:
            self._verify_params_across_processes(params, names)
            self._sync_module_states(src=0, buffers=broadcast_buffers)
        self._bucket_cap_mb = bucket_cap_mb
        self._bucket_caps = bucket_caps(bucket_cap_mb)
        self.reducer = self._build_reducer(params, names, static_graph)
        self._comm_hooks: list[tuple[Callable[..., Any], Any]] = []
        if static_graph:
            self._set_static_graph()

    def _build_reducer(self, params: list[nn.Parameter], names: list[str],
                       static_graph: bool) -> Reducer:
        first_cap, cap = self._bucket_caps
        # a gradient of a quarter of the cap or more is all_reduced alone, where it lies
        # (reducer.py): copying it into a bucket and back costs more than one more collective
        plans = plan_buckets([p.numel() for p in params], [p.element_size() for p in params],
                             [(p.dtype, p.device) for p in params], first_cap, cap,
                             solo_bytes=cap // 4 or None)
        return Reducer(params, names, plans, self.process_group,
                       self.find_unused_parameters or static_graph, self.gradient_as_bucket_view)

    # ---- pickling (torch.save of the whole wrapped model) --------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the process group and the reducer, as torch's DDP.

        Raises:
            RuntimeError: the module averages over a group other than the default one.
        """
        if not dist.is_initialized() or self.process_group is not dist.group.WORLD:
            raise RuntimeError("DDP Pickling/Unpickling are only supported when using DDP with "
                               "the default process group. That is, when you have called "
                               "init_process_group and have not passed process_group argument "
                               "to DDP constructor")
        state = dict(self.__dict__)
        del state["process_group"], state["reducer"], state["_device_rt"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild on the default group of the loading process: a new reducer, no comm hook
        (as torch; ``_comm_hooks`` keeps what was registered, unapplied), no broadcast.

        Raises:
            ValueError: the default process group is not initialized (torch's message).
        """
        self.process_group = _default_group()
        super().__setstate__(state)
        self.__dict__.setdefault("require_forward_param_sync", True)
        self.__dict__.setdefault("require_backward_grad_sync", True)
        self._device_rt = place.runtime_of(self.module.parameters())
        self.reducer = self._build_reducer(*self._params_for_reducer(), self.static_graph)
        if self.static_graph:
            self.reducer.static_graph = True

    # ---- construction helpers ------------------------------------------------------------

    def _check_devices(self, named: list[tuple[str, nn.Parameter]],
                       device_ids: Sequence[int | torch.device] | None,
                       output_device: int | torch.device | None) -> None:
        if device_ids is not None and len(device_ids) > 1:
            raise ValueError("device_ids can only be None or contain a single element.")
        # a module in device memory (CUDA, or the simulated runtime's): gpu_training
        self._device_rt = place.runtime_of(p for _, p in named)
        if self._device_rt is not None and not place.training_opened():
            raise RuntimeError(place.CLOSED.format(what="DistributedDataParallel on a GPU "
                                                        "module"))
        if place.is_sim(self._device_rt) and device_ids:
            # simulated device memory is CPU memory: inputs stay where they are
            index = device_ids[0] if isinstance(device_ids[0], int) else device_ids[0].index
            self.device_type, self.is_multi_device_module = "cpu", False
            self.device_ids = [self._device_rt.device(index or 0)]  # type: ignore[union-attr]
            self.output_device = self.device_ids[0]
            return
        devices = {p.device for _, p in named}
        device_types = {d.type for d in devices}
        if len(device_types) != 1:
            raise ValueError("DistributedDataParallel's input module must be on the same type of "
                             f"devices, but input module parameters locate in {device_types}.")
        self.device_type = next(iter(device_types))
        self.is_multi_device_module = len(devices) > 1
        if not device_ids or self.device_type == "cpu" or self.is_multi_device_module:
            if device_ids or output_device:
                raise ValueError(
                    "DistributedDataParallel device_ids and output_device arguments only work "
                    "with single-device/multiple-device GPU modules or CPU modules, but got "
                    f"device_ids {device_ids}, output_device {output_device}, and module "
                    f"parameters {devices}.")
            self.device_ids = None
            self.output_device = None
            return
        self.device_ids = [torch.device(self.device_type, d) if isinstance(d, int) else d
                           for d in device_ids]
        self.output_device = output_device if output_device is not None else self.device_ids[0]

    def _params_for_reducer(self) -> tuple[list[nn.Parameter], list[str]]:
        """Trainable parameters in module order, each once, with their qualified names."""
        seen: set[int] = set()
        params, names = [], []
        for module_name, module in self.module.named_modules():
            for param_name, param in module.named_parameters(recurse=False):
                fqn = f"{module_name}.{param_name}" if module_name else param_name
                if param.requires_grad and fqn not in self.parameters_to_ignore \
                        and id(param) not in seen:
                    seen.add(id(param))
                    params.append(param)
                    names.append(fqn)
        return params, names

    def _assign_modules_buffers(self) -> None:
        """Re-read the buffers each time: a module may reassign them."""
        self.named_module_buffers = {n: b for n, b in self.module.named_buffers()
                                     if n not in self.parameters_to_ignore}
        self.modules_buffers = list(self.named_module_buffers.values())

    def _verify_params_across_processes(self, params: list[nn.Parameter], names: list[str]) -> None:
        mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(names, params, strict=True)]
        everyone: list[Any] = [None] * dist.get_world_size(self.process_group)
        dist.all_gather_object(everyone, mine, group=self.process_group)
        reference = everyone[0]
        for rank, theirs in enumerate(everyone):
            if len(theirs) != len(reference):
                raise RuntimeError(f"DDP expects same model across all ranks, but Rank {rank} has "
                                   f"{len(theirs)} params, while rank 0 has inconsistent "
                                   f"{len(reference)} params.")
            for i, (ours, ref) in enumerate(zip(theirs, reference, strict=True)):
                if ours[1:] != ref[1:]:
                    raise RuntimeError(
                        f"DDP expects same model across all ranks, but Rank {rank}: {i}-th param "
                        f"{ours[0]} with shape {list(ours[1])} and {ours[2]} appears not to match "
                        f"the same param in process 0 ({ref[0]} with shape {list(ref[1])} and "
                        f"{ref[2]}).")

    # ---- collectives on parameters and buffers -------------------------------------------

    def _global_rank(self, group_rank: int) -> int:
        if self.process_group is dist.group.WORLD:
            return group_rank
        return dist.get_global_rank(self.process_group, group_rank)

    @torch.no_grad()
    def _broadcast_coalesced(self, tensors: list[torch.Tensor], src: int) -> None:
        """Broadcast ``tensors`` from group rank ``src`` in few flat messages per dtype."""
        src_global = self._global_rank(src)
        is_src = dist.get_rank(self.process_group) == src
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for t in tensors:
            groups.setdefault((t.dtype, t.device), []).append(t)
        for group in groups.values():
            for chunk in _chunks(group, self.broadcast_bucket_size):
                flat = torch.cat([t.detach().reshape(-1) for t in chunk])
                if place.is_sim(self._device_rt):  # as on CUDA: broadcast in device memory
                    flat = place.to_device(flat, 0, self._device_rt)
                dist.broadcast(flat, src=src_global, group=self.process_group)
                place.fence(self._device_rt)
                if not is_src:
                    offset = 0
                    for t in chunk:
                        t.copy_(flat[offset:offset + t.numel()].view_as(t))
                        offset += t.numel()

    def _sync_module_states(self, src: int, buffers: bool) -> None:
        tensors = [p for n, p in self.module.named_parameters()
                   if n not in self.parameters_to_ignore]
        if buffers:
            tensors += self.modules_buffers
        self._broadcast_coalesced(tensors, src)

    def will_sync_module_buffers(self) -> bool:
        return (self.require_forward_param_sync and self.broadcast_buffers
                and len(self.modules_buffers) > 0)

    def _find_common_rank(self, input_rank: int, rank_cond: bool) -> int:
        """The highest group rank for which ``rank_cond`` holds, agreed by all ranks."""
        candidate = torch.tensor([input_rank if rank_cond else -1], device=self.device)
        dist.all_reduce(candidate, op=dist.ReduceOp.MAX, group=self.process_group)
        return int(candidate.item())

    def _sync_buffers(self, authoritative_candidate: bool = True) -> None:
        """Broadcast the buffers from rank 0 (under Join: from the highest non-joined rank)."""
        src = 0
        if self._join_config.enable:
            src = self._find_common_rank(dist.get_rank(self.process_group),
                                         authoritative_candidate)
        self._assign_modules_buffers()
        self._broadcast_coalesced(self.modules_buffers, src)

    def _sync_final_model(self, is_last_joiner: bool) -> None:
        self._authoritative_rank = self._find_common_rank(dist.get_rank(self.process_group),
                                                          is_last_joiner)
        self._sync_module_states(self._authoritative_rank, buffers=self.broadcast_buffers)

    def _check_global_requires_backward_grad_sync(self, is_joined_rank: bool) -> bool | None:
        """Under Join: tell the joined ranks whether this iteration reduces gradients."""
        syncing = not is_joined_rank and self.require_backward_grad_sync
        flag = torch.ones(1, device=self.device) if syncing else torch.zeros(1, device=self.device)
        work = dist.all_reduce(flag, group=self.process_group, async_op=True)
        if not is_joined_rank:
            return None
        work.wait()
        return flag.item() != 0

    # ---- forward -------------------------------------------------------------------------

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        grad_sync = torch.is_grad_enabled() and self.require_backward_grad_sync
        notified = Join.notify_join_context(self)
        self.reducer.set_forward_pass_work_handle(
            notified, self._divide_by_initial_world_size or notified is None)
        if self.will_sync_module_buffers():
            self._sync_buffers()
        if self._join_config.enable:
            self._check_global_requires_backward_grad_sync(is_joined_rank=False)
        if self.device_ids:
            inputs = _move_to(inputs, self.device_ids[0])
            kwargs = _move_to(kwargs, self.device_ids[0])
        output = self.module(*inputs, **kwargs)
        if grad_sync:
            self.require_forward_param_sync = True
            self.reducer.prepare_for_backward(_find_tensors(output))
        else:
            self.require_forward_param_sync = False
        return output

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally; the first synced backward after it averages the sum.

        The forward must run inside the context for its backward to skip the reduction.
        """
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # ---- uneven inputs -------------------------------------------------------------------

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """Context manager for uneven inputs: ranks that run out shadow the others' iterations.

        Once every rank has joined, the model of the last rank to join is broadcast to all.
        """
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _DDPJoinHook(self, kwargs.get("divide_by_initial_world_size", True))

    @property
    def join_device(self) -> torch.device:
        return self.device

    @property
    def join_process_group(self) -> Any:
        return self.process_group

    # ---- communication hooks -------------------------------------------------------------

    def register_comm_hook(self, state: object, hook: Callable[..., Any]) -> None:
        """Replace the bucket all_reduce by ``hook(state, bucket) -> Future[Tensor]``.

        The hook sees undivided gradients and must average them itself. Once per DDP module.

        Raises:
            TypeError: ``hook`` is not callable.
            ValueError: its annotations say it takes or returns something else.
            RuntimeError: a hook was already registered.
        """
        _check_comm_hook(hook)
        self.reducer.register_comm_hook(state, hook)
        self._comm_hooks.append((hook, state))

    def rewrap(self, process_group: Any = None) -> DistributedDataParallel:
        """The same module, with the same options, on ``process_group`` (default: the default
        group): for a world that changed (``ringtorch.distributed.shrink_on_failure``).

        This DDP stops: its autograd hooks are removed, and it must not be used again (its
        group is gone). The new one broadcasts the parameters and buffers from the new group's
        rank 0, so that the survivors go on from one state even when the failure left them a
        step apart. Communication hooks are not carried over (their state refers to the old
        group): register them again. Call it on every rank of ``process_group``.
        """
        self._remove_autograd_hooks()
        new = DistributedDataParallel(
            self.module, dim=self.dim, broadcast_buffers=self.broadcast_buffers,
            process_group=process_group, bucket_cap_mb=self._bucket_cap_mb,
            find_unused_parameters=self.find_unused_parameters,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            static_graph=self.static_graph)
        new.require_backward_grad_sync = self.require_backward_grad_sync
        return new

    def _set_static_graph(self) -> None:
        self.static_graph = True
        self.reducer.static_graph = True

    def _remove_autograd_hooks(self) -> None:
        self.reducer.remove_hooks()


def _chunks(tensors: list[torch.Tensor], cap_bytes: int) -> Iterator[list[torch.Tensor]]:
    chunk: list[torch.Tensor] = []
    nbytes = 0
    for t in tensors:
        chunk.append(t)
        nbytes += t.numel() * t.element_size()
        if nbytes >= cap_bytes:
            yield chunk
            chunk, nbytes = [], 0
    if chunk:
        yield chunk


def _reject_sparse(module: nn.Module) -> None:
    for name, sub in module.named_modules():
        if isinstance(sub, (nn.Embedding, nn.EmbeddingBag)) and sub.sparse:
            raise ValueError(f"ringtorch's DistributedDataParallel reduces dense gradients only, "
                             f"but module {name!r} produces sparse ones: construct it with "
                             f"sparse=False")


def _annotation_is(annotation: Any, names: tuple[str, ...], types: tuple[Any, ...]) -> bool:
    if annotation is inspect.Parameter.empty:
        return True
    if isinstance(annotation, str):
        return annotation.replace(" ", "").endswith(names)
    return any(annotation == t for t in types)


def _check_comm_hook(hook: Callable[..., Any]) -> None:
    if not callable(hook):
        raise TypeError("Communication hook must be callable.")
    sig = inspect.signature(hook)
    bucket = sig.parameters.get("bucket")
    if bucket is not None and not _annotation_is(bucket.annotation, ("GradBucket",),
                                                 (dist.GradBucket,)):
        raise ValueError("Communication hook: bucket annotation should be dist.GradBucket.")
    if not _annotation_is(sig.return_annotation, ("Future[torch.Tensor]", "Future[Tensor]"),
                          (torch.futures.Future[torch.Tensor],)):
        raise ValueError("Communication hook: return annotation should be "
                         "torch.futures.Future[torch.Tensor].")

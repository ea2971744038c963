"""ZeroRedundancyOptimizer: each rank keeps the optimizer state of only its shard of the parameters.

torch's ``torch.distributed.optim.ZeroRedundancyOptimizer`` (ZeRO stage 1), same constructor,
methods, partition and errors, over the public names of ``ringtorch.distributed``. The rule it
keeps: every parameter is owned by exactly one rank of the group, chosen by torch's sorted-greedy
partition (``partition_greedy``), so the same parameters land on the same ranks as under torch;
only the owner's local optimizer updates it, and ``step()`` then broadcasts it from its owner, so
after ``step()`` every rank holds the same parameters while holding ``~1/world_size`` of the state.

The global state dict uses torch's global parameter indexing (parameters numbered across the
param groups in order), so a dict consolidated at one world size loads at another.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any

import torch
from torch.optim import Optimizer

from ringtorch import distributed as dist
from ringtorch.distributed.algorithms.join import Join, Joinable, JoinHook

__all__ = ["ZeroRedundancyOptimizer"]

log = logging.getLogger(__name__)


def partition_greedy(param_groups: list[list[torch.Tensor]], world_size: int
                     ) -> list[list[list[torch.Tensor]]]:
    """torch's partition: ``result[rank][group]`` lists the parameters ``rank`` owns.

    Within each group the parameters are taken largest first (a stable sort by ``numel``), and
    each goes to the rank with the fewest elements so far (the lowest such rank on ties); the
    running sizes carry over from one group to the next. A pure function, so that the partition
    can be checked against torch's without processes.
    """
    sizes = [0] * world_size
    result: list[list[list[torch.Tensor]]] = [[] for _ in range(world_size)]
    for params in param_groups:
        per_rank: list[list[torch.Tensor]] = [[] for _ in range(world_size)]
        for param in sorted(params, key=lambda t: t.numel(), reverse=True):
            rank = sizes.index(min(sizes))
            per_rank[rank].append(param)
            sizes[rank] += param.numel()
        for rank in range(world_size):
            result[rank].append(per_rank[rank])
    return result


def _copy_to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor inside lists, tuples and dicts copied to ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        copied = [_copy_to_device(v, device) for v in value]
        return copied if isinstance(value, list) else tuple(copied)
    if isinstance(value, dict):
        return {k: _copy_to_device(v, device) for k, v in value.items()}
    return value


def _sync_param_groups(src: list[dict[str, Any]], dst: list[dict[str, Any]]) -> None:
    """Copy every hyperparameter (all but ``params``) of each group of ``src`` into ``dst``."""
    if len(src) != len(dst):
        raise AssertionError("Mismatch between number of source and destination parameter groups")
    for src_group, dst_group in zip(src, dst, strict=True):
        for key, value in src_group.items():
            if key != "params":
                dst_group[key] = value


class _ZeROJoinHook(JoinHook):
    """Shadows the optimizer step on a rank that has run out of inputs.

    The joined rank steps its shard with the gradients it holds and broadcasts it, so that the
    other ranks' broadcasts from it are matched and its parameters keep being updated.
    """

    def __init__(self, zero: ZeroRedundancyOptimizer) -> None:
        if not isinstance(zero, ZeroRedundancyOptimizer):
            raise AssertionError("ZeRO join hook requires passing in a ZeroRedundancyOptimizer "
                                 "instance as the state")
        self.zero = zero
        super().__init__()

    def main_hook(self) -> None:
        self.zero.step()


class ZeroRedundancyOptimizer(Optimizer, Joinable):
    """Wrap ``optimizer_class`` so that its state is sharded across the ranks of the group.

    Args:
        params: tensors or param-group dicts (all tensors of one dense type), all of which are
            partitioned across the ranks.
        optimizer_class: the local optimizer's class (e.g. ``torch.optim.Adam``).
        process_group: the group to shard over (default: the default group).
        parameters_as_bucket_view: pack each rank's shard into one flat tensor per device, which
            the parameters' ``.data`` become views of, so ``step()`` broadcasts one tensor per
            rank instead of one per parameter.
        overlap_with_ddp: overlapping the step with DDP's gradient reduction; not supported
            by ringtorch (NotImplementedError).
        **defaults: passed on to ``optimizer_class`` (``lr=...``).

    Raises:
        TypeError: ``params`` is a tensor, not iterable, or mixes tensors and dicts.
        ValueError: ``params`` is empty, a group has no ``params`` key, the parameters are
            sparse or of several dense types, or this rank is not in ``process_group``.
        NotImplementedError: ``overlap_with_ddp=True``.

    Every method that communicates must be called on every rank of the group.
    """

    def __init__(self, params: Iterable[Any], optimizer_class: type[Optimizer],
                 process_group: Any | None = None, parameters_as_bucket_view: bool = False,
                 overlap_with_ddp: bool = False, **defaults: Any) -> None:
        params = self._verify_and_init_params(params)
        self._verify_same_dense_param_type()
        if overlap_with_ddp:
            raise NotImplementedError(
                "ZeroRedundancyOptimizer(overlap_with_ddp=True) is not supported by ringtorch "
                "(it needs torch's ddp_zero_hook communication hooks); pass "
                "overlap_with_ddp=False and call step() after backward(), with "
                "parameters_as_bucket_view=True to broadcast each shard as one tensor")
        self.initialized = False  # Optimizer.__init__ calls add_param_group: no partition yet
        Optimizer.__init__(self, params, defaults)
        Joinable.__init__(self)
        self._partition_parameters_cache: list[list[dict[str, Any]]] = []
        self._param_to_rank_cache: dict[torch.Tensor, int] = {}
        self._param_to_index_cache: dict[torch.Tensor, int] = {}
        self._index_to_param_cache: list[torch.Tensor] = []
        self._is_trainable_mask = self._get_is_trainable_mask()
        self._default_device = self._all_params[0].device
        self.process_group = process_group if process_group is not None else dist.group.WORLD
        self.world_size: int = dist.get_world_size(self.process_group)
        self.rank: int = dist.get_rank(self.process_group)
        if self.rank < 0:  # not a member: torch's get_global_rank(group, -1) message
            raise ValueError(f"Group rank {self.rank} is not part of group {self.process_group}")
        self.global_rank: int = dist.get_global_rank(self.process_group, self.rank)
        self._overlap_with_ddp = overlap_with_ddp
        self._optim_defaults = defaults
        self._optim_constructor = optimizer_class
        self._init_local_optimizer()
        self.parameters_as_bucket_view = parameters_as_bucket_view
        self._buckets: list[list[torch.Tensor]] = []  # [device][rank]
        self._build_param_buckets()
        self._all_state_dicts: list[dict[str, Any]] = []  # filled on the consolidation target
        self.initialized = True

    # ---- parameters and their partition ----------------------------------------------------

    def _verify_and_init_params(self, params: Any) -> list[Any]:
        """Check ``params``' type (torch's messages) and record every parameter in ``_all_params``."""
        if isinstance(params, torch.Tensor):
            raise TypeError("`params` argument should be an iterable of Tensors, but got "
                            f"{torch.typename(params)}")
        try:
            all_params = list(params)
        except TypeError as exc:
            raise TypeError("`params` argument should be an iterable of Tensors or dicts, but "
                            f"got {torch.typename(params)}") from exc
        if len(all_params) == 0:
            raise ValueError("ZeroRedundancyOptimizer got an empty parameter list")
        if all(isinstance(p, torch.Tensor) for p in all_params):
            self._all_params: list[torch.Tensor] = all_params
        elif all(isinstance(p, dict) for p in all_params):
            self._all_params = []
            for group in all_params:
                if "params" not in group:
                    raise ValueError("Each parameter group passed-in via `params` must have a "
                                     "'params' key mapping to the parameters in the group")
                self._all_params.extend(group["params"])
        else:
            raise TypeError("`params` argument should be an iterable of Tensors or dicts")
        return all_params

    def _verify_same_dense_param_type(self) -> None:
        """One dense type for all: the buckets and broadcasts assume a single dtype."""
        first = self._all_params[0]
        typename = torch.typename(first)
        if first.is_sparse:
            raise ValueError("ZeroRedundancyOptimizer only supports using the same dense type "
                             f"for all parameters but got {typename}")
        for param in self._all_params[1:]:
            other = torch.typename(param)
            if other != typename:
                raise ValueError("ZeroRedundancyOptimizer only supports using the same dense "
                                 f"type for all parameters but got both {typename} and {other}")

    def _get_is_trainable_mask(self) -> list[bool]:
        return [param.requires_grad for param in self._all_params]

    def _clear_cache(self) -> None:
        self._partition_parameters_cache = []
        self._param_to_rank_cache = {}
        self._param_to_index_cache = {}
        self._index_to_param_cache = []

    def _partition_parameters(self, params_per_rank: list[list[torch.Tensor]] | None = None
                              ) -> list[list[dict[str, Any]]]:
        """``result[rank]``: the param groups (hyperparameters and owned params) of ``rank``.

        ``params_per_rank`` sets the partition by hand (one param group only, before any
        partition was computed), as torch's private method of this name allows.

        Raises:
            RuntimeError: ``params_per_rank`` with several param groups.
            ValueError: ``params_per_rank`` of the wrong length or with unknown parameters.
        """
        if params_per_rank is None:
            if not self._partition_parameters_cache:
                owned = partition_greedy([g["params"] for g in self.param_groups],
                                         self.world_size)
                self._partition_parameters_cache = [
                    [{**group, "params": owned[rank][i]} for i, group in
                     enumerate(self.param_groups)] for rank in range(self.world_size)]
            return self._partition_parameters_cache
        if self._partition_parameters_cache:
            raise AssertionError("Specifying `params_per_rank` should only be done when the "
                                 "parameters have not been partitioned yet")
        if len(self.param_groups) != 1:
            raise RuntimeError("Specifying `params_per_rank` only supports a single parameter "
                               "group")
        if len(params_per_rank) != self.world_size:
            raise ValueError("`params_per_rank` must have length equal to the world size")
        known = set(self._all_params)
        if any(p not in known for params in params_per_rank for p in params):
            raise ValueError("Passing a new parameter in `params_per_rank` that was not passed "
                             "into the ZeroRedundancyOptimizer constructor")
        group = self.param_groups[0]
        self._partition_parameters_cache = [[{**group, "params": list(params)}]
                                            for params in params_per_rank]
        return self._partition_parameters_cache

    @property
    def _param_to_rank(self) -> dict[torch.Tensor, int]:
        if not self._param_to_rank_cache:
            for rank, groups in enumerate(self._partition_parameters()):
                for group in groups:
                    for param in group["params"]:
                        self._param_to_rank_cache[param] = rank
        return self._param_to_rank_cache

    @property
    def _param_to_index(self) -> dict[torch.Tensor, int]:
        """Parameter -> its index in the global state dict (numbered across groups in order)."""
        if not self._param_to_index_cache:
            self._param_to_index_cache = {p: i for i, p in enumerate(self._index_to_param)}
        return self._param_to_index_cache

    @property
    def _index_to_param(self) -> list[torch.Tensor]:
        if not self._index_to_param_cache:
            self._index_to_param_cache = list(chain.from_iterable(
                g["params"] for g in self.param_groups))
        return self._index_to_param_cache

    def _init_local_optimizer(self) -> None:
        """Build ``self.optim`` over this rank's shard, one group per exposed group.

        Passing the groups (possibly with empty ``params``) rather than a flat list keeps the
        local group indices aligned with the exposed ones even when this rank owns nothing.
        """
        self.optim: Optimizer = self._optim_constructor(self._partition_parameters()[self.rank],
                                                        **self._optim_defaults)
        _sync_param_groups(self.optim.param_groups, self.param_groups)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a param group and shard it; call it on every rank with the same group.

        The partition is recomputed from scratch, which leaves the earlier groups' owners as
        they were (the greedy pass visits them first, identically), so the local optimizer only
        gains this rank's share of the new group.
        """
        super().add_param_group(param_group)
        if not self.initialized:
            return
        self._all_params = list(chain.from_iterable(g["params"] for g in self.param_groups))
        self._is_trainable_mask = self._get_is_trainable_mask()
        self._clear_cache()
        mine = self._partition_parameters()[self.rank]
        if len(mine) == len(self.optim.param_groups) + 1:
            self.optim.add_param_group(mine[-1])
        if self.parameters_as_bucket_view:
            self._build_param_buckets()

    def _build_param_buckets(self) -> None:
        """With ``parameters_as_bucket_view``: one flat tensor per (device, owner rank).

        Each trainable parameter's ``.data`` becomes a view into its bucket; a frozen one gets
        its own copy back (it may have been in a bucket before). A rank that owns nothing on a
        device gets a one-element placeholder, so that every rank broadcasts alike.
        """
        if not self.parameters_as_bucket_view:
            return
        by_device: dict[torch.device, list[list[torch.Tensor]]] = {}
        for rank, groups in enumerate(self._partition_parameters()):
            for group in groups:
                for param in group["params"]:
                    by_device.setdefault(param.device, [[] for _ in range(self.world_size)])
                    by_device[param.device][rank].append(param)
        self._buckets = []
        for device, per_rank in by_device.items():
            buckets = []
            for params in per_rank:
                for param in params:
                    if not param.requires_grad:
                        param.data = param.data.detach().clone()
                trainable = [p for p in params if p.requires_grad]
                numel = sum(p.numel() for p in trainable)
                if numel == 0:
                    buckets.append(torch.zeros(1, device=device))
                    continue
                bucket = torch.empty(numel, dtype=trainable[0].dtype, device=device)
                offset = 0
                for param in trainable:
                    view = bucket[offset:offset + param.numel()]
                    view.copy_(param.data.flatten())
                    param.data = view.view_as(param.data)
                    offset += param.numel()
                buckets.append(bucket)
            self._buckets.append(buckets)

    # ---- step --------------------------------------------------------------------------------

    def step(self, closure: Callable[[], float] | None = None, **kwargs: Any) -> float | None:
        """Step this rank's shard, then broadcast every shard from its owner to all ranks.

        Returns:
            The local optimizer's return value (the closure's loss, if any).
        """
        loss = self._local_step(closure=closure, **kwargs)
        self._sync_params()
        return loss

    def _local_step(self, closure: Callable[[], float] | None = None,
                    **kwargs: Any) -> float | None:
        """Step the local optimizer only (no communication but the join notification)."""
        Join.notify_join_context(self)
        mask = self._get_is_trainable_mask()
        if mask != self._is_trainable_mask:
            log.warning("ZeroRedundancyOptimizer detected that the trainable parameters "
                        "changed; rebuilding the parameter buckets if enabled")
            self._build_param_buckets()
            self._is_trainable_mask = mask
        _sync_param_groups(self.param_groups, self.optim.param_groups)
        if closure is None:
            loss = self.optim.step(**kwargs)
        else:
            loss = self.optim.step(closure=closure, **kwargs)
        _sync_param_groups(self.optim.param_groups, self.param_groups)
        return loss

    def _sync_params(self) -> None:
        """Broadcast every shard from its owner: one tensor per bucket, or per parameter."""
        works = []
        for rank in range(self.world_size):
            src = dist.get_global_rank(self.process_group, rank)
            if self.parameters_as_bucket_view:
                tensors = [buckets[rank] for buckets in self._buckets]
            else:
                tensors = [p.data for g in self._partition_parameters()[rank] for p in g["params"]]
            works.extend(dist.broadcast(t, src=src, group=self.process_group, async_op=True)
                         for t in tensors)
        for work in works:
            work.wait()

    # ---- join --------------------------------------------------------------------------------

    def rewrap(self, process_group: Any | None = None) -> ZeroRedundancyOptimizer:
        """The same parameters, local optimizer and settings, sharded over ``process_group``
        (default: the default group): for a world that changed
        (``ringtorch.distributed.shrink_on_failure``, ``admit_joiners``). Call it on every rank
        of the new group; a replacement that joined calls it on the optimizer it made there.

        Each rank's shard of the optimizer state moves to the parameters' new owners (an
        all_gather_object on the new group); the state of the parameters a lost rank owned is
        gone with it, and starts afresh, as a fresh optimizer's. The settings of the parameter
        groups (``lr`` as a scheduler left it, ...) are those of the lowest rank that holds
        optimizer state, so that a replacement's fresh optimizer steps its shard as the
        members step theirs. This optimizer must not be used again.
        """
        group = process_group if process_group is not None else dist.group.WORLD
        mine = {self._param_to_index[p]: _copy_to_device(state, torch.device("cpu"))
                for p, state in self.optim.state.items()}
        settings = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, (mine, settings), group=group)
        # a member has stepped (it holds state); a replacement's settings are its constructor's
        source = next((theirs for state, theirs in gathered if state), settings)
        groups = [{**chosen, "params": list(g["params"])}
                  for chosen, g in zip(source, self.param_groups, strict=True)]
        new = ZeroRedundancyOptimizer(groups, self._optim_constructor, process_group=group,
                                      parameters_as_bucket_view=self.parameters_as_bucket_view,
                                      **self._optim_defaults)
        states = {index: state for part, _ in gathered for index, state in part.items()}
        for param_group in new.optim.param_groups:
            for param in param_group["params"]:
                index = new._param_to_index[param]
                if index in states:
                    new.optim.state[param] = _copy_to_device(states[index], param.device)
        return new

    def join_hook(self, **_kwargs: Any) -> JoinHook:
        """The hook that shadows ``step()`` on a joined rank (it takes no keyword arguments).

        The gradients the joined rank holds must be set when it runs (DDP's hook leaves them as
        the rank's last backward made them).
        """
        return _ZeROJoinHook(self)

    @property
    def join_device(self) -> torch.device:
        return self._default_device

    @property
    def join_process_group(self) -> Any:
        return self.process_group

    # ---- state dicts -------------------------------------------------------------------------

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's local optimizer state on group rank ``to`` (call on all ranks).

        Afterwards ``state_dict()`` works on rank ``to`` (and gives the state as of this call).

        Raises:
            ValueError: ``to`` is not a rank of the group.
        """
        if not 0 <= to < self.world_size:
            raise ValueError(f"consolidate_state_dict(to={to}): the group has ranks 0 to "
                             f"{self.world_size - 1}")
        _sync_param_groups(self.param_groups, self.optim.param_groups)
        gathered: list[Any] | None = [None] * self.world_size if self.rank == to else None
        dist.gather_object(self.optim.state_dict(), gathered, group=self.process_group,
                           group_dst=to)
        cpu = torch.device("cpu")
        self._all_state_dicts = [] if gathered is None else [_copy_to_device(sd, cpu)
                                                             for sd in gathered]

    def state_dict(self) -> dict[str, Any]:
        """The whole optimizer's state as of the last ``consolidate_state_dict`` to this rank.

        Same layout as a plain optimizer's over all the parameters (torch's global indexing).

        Raises:
            RuntimeError: the state was not consolidated on this rank.
        """
        if not self._all_state_dicts:
            raise RuntimeError("Optimizer state has not been consolidated on this rank. Please "
                               f"call `consolidate_state_dict(to={self.rank})` on all ranks "
                               "beforehand if you meant to save the global state.")
        state_dict = super().state_dict()
        partition = self._partition_parameters()
        for rank, local in enumerate(self._all_state_dicts):
            for local_group, global_group in zip(local["param_groups"], partition[rank],
                                                 strict=True):
                for local_index, param in zip(local_group["params"], global_group["params"],
                                              strict=True):
                    if local_index in local["state"]:
                        state_dict["state"][self._param_to_index[param]] = (
                            local["state"][local_index])
        state_dict["state"] = dict(sorted(state_dict["state"].items()))
        return state_dict

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a global state dict (from ``state_dict()``, at any world size), keeping this
        rank's share of the state in the local optimizer.

        Raises:
            ValueError: the dict's param groups do not match this optimizer's (torch's messages).
        """
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(self.param_groups, groups,
                                                                      strict=True)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match "
                             "the size of optimizer's group")
        for index, value in state_dict["state"].items():
            param = self._index_to_param[index]
            if self._param_to_rank[param] != self.rank:
                continue
            local = _copy_to_device(value, param.device)
            for name, item in (local.items() if isinstance(local, dict) else ()):
                if torch.is_tensor(item) and item.dim() == 0:  # as torch: scalars (Adam's
                    local[name] = item.cpu()                   # step) stay on the CPU
            self.optim.state[param] = local
        # the exposed optimizer takes the hyperparameters; the state stays in the shards only
        super().load_state_dict({"state": {}, "param_groups": groups})
        _sync_param_groups(groups, self.param_groups)
        _sync_param_groups(self.param_groups, self.optim.param_groups)

"""``torch.distributed.distributed_c10d``: the facade under torch's module name.

Programs and libraries import from this path: torch's public names (the same objects as
``ringtorch.distributed``'s), and a few private helpers that widely used libraries import from
it, with torch's behaviour:

==============================  ===========================================================
``_get_default_group``          DeepSpeed, ColossalAI, torch's own RPC and DDP code, Ascend
                                and vLLM-Ascend plug-ins
``_get_default_store``,         vLLM and its plug-ins (a store and timeout for a side group)
``_get_default_timeout``
``_rank_not_in_group``          PyTorch Lightning (``broadcast_object_list``), FSDP tests and
                                tutorials
``_object_to_tensor``,          PyTorch Lightning and Fabric (their object broadcast), torch
``_tensor_to_object``           issue reproducers
``_get_global_rank``            DeepSpeed and its NPU plug-in, fairscale
``_get_process_group_name``,    torch.compile's functional collectives, torchtune, TorchTitan
``_get_group_tag``,
``_resolve_process_group``,
``_world``
``_check_single_tensor``,       libraries that validate arguments as torch's collectives do
``_check_tensor_list``
``_get_pg_default_device``      FSDP utilities and checkpointing helpers
``_store_based_barrier``        code that synchronises ranks after building groups
``GroupMember``, ``group``      Megatron-LM, DeepSpeed (``GroupMember.WORLD``)
==============================  ===========================================================

The rule it keeps: nothing is implemented twice; every name is the object of
``ringtorch.distributed`` (or a thin function over it).
"""

from __future__ import annotations

import io
import pickle
import warnings
from datetime import timedelta
from typing import Any

import torch

from ringtorch.distributed import (
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    Backend,
    BackendConfig,
    BarrierOptions,
    BroadcastOptions,
    DebugLevel,
    GatherOptions,
    GroupMember,
    GroupName,
    P2POp,
    PrefixStore,
    ProcessGroup,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    Store,
    Work,
    all_gather,
    all_gather_coalesced,
    all_gather_into_tensor,
    all_gather_object,
    all_gather_single,
    all_reduce,
    all_reduce_coalesced,
    all_to_all,
    all_to_all_single,
    barrier,
    batch_isend_irecv,
    broadcast,
    broadcast_object_list,
    default_pg_timeout,
    destroy_process_group,
    gather,
    gather_object,
    get_backend,
    get_backend_config,
    get_debug_level,
    get_default_backend_for_device,
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_pg_count,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    init_process_group,
    irecv,
    is_backend_available,
    is_gloo_available,
    is_initialized,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    is_ucc_available,
    is_xccl_available,
    isend,
    monitored_barrier,
    new_group,
    new_subgroups,
    new_subgroups_by_enumeration,
    record_comm,
    recv,
    recv_object_list,
    reduce,
    reduce_op,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
    scatter,
    scatter_object_list,
    send,
    send_object_list,
    shrink_group,
    split_group,
    supports_complex,
)
from ringtorch.distributed._args import check_single_tensor, check_tensor_list
from ringtorch.distributed._torch_world import engine_of, torch_object
from ringtorch.distributed._world import _world
from ringtorch.distributed.groups import _get_default_group as _get_default_group
from ringtorch.distributed.groups import _get_default_store as _get_default_store
from ringtorch.distributed.groups import _store_based_barrier as _init_barrier
from ringtorch.distributed.shrink import SHRINK_ABORT as SHRINK_ABORT
from ringtorch.distributed.shrink import SHRINK_DEFAULT as SHRINK_DEFAULT

default_pg_nccl_timeout: timedelta | None = None
"""NCCL's default timeout; None, as in a torch built without NCCL (ringtorch has no NCCL)."""


def _get_default_timeout(backend: Any) -> timedelta:
    """The default timeout of a group of ``backend`` (30 minutes; for NCCL, which this build
    does not have, the same with torch's warning)."""
    if backend == Backend.NCCL:
        warnings.warn("Attempted to get default timeout for nccl backend, but NCCL support is "
                      "not compiled", stacklevel=2)
    return default_pg_timeout


def _rank_not_in_group(group: ProcessGroup | None) -> bool:
    """Whether this process is outside ``group`` (what ``new_group`` gave a non-member)."""
    if group is None:
        return False
    return group == GroupMember.NON_GROUP_MEMBER


def _check_single_tensor(param: Any, param_name: str) -> None:
    """Raise torch's TypeError unless ``param`` is a tensor."""
    check_single_tensor(param, param_name)


def _check_tensor_list(param: Any, param_name: str) -> None:
    """Raise torch's TypeError unless ``param`` is a list of tensors."""
    check_tensor_list(param, param_name)


def _get_global_rank(group: ProcessGroup, rank: int) -> int:
    """Deprecated spelling of :func:`get_global_rank`."""
    warnings.warn("`ringtorch.distributed.distributed_c10d._get_global_rank` is deprecated, "
                  "please use `ringtorch.distributed.distributed_c10d.get_global_rank` instead",
                  stacklevel=2)
    return get_global_rank(group, rank)


def _get_process_group_name(pg: ProcessGroup) -> str:
    """The name ``pg`` was registered under, or ``"None"`` for a group this process does not
    know."""
    return _world.pg_names.get(engine_of(pg), "None")


def _get_group_tag(pg: ProcessGroup) -> str:
    """The tag of ``pg``: ``"ptd:<group name>"`` (ringtorch groups carry no user tag).

    Raises:
        KeyError: ``pg`` is not a group of this process.
    """
    return f"ptd:{_world.pg_names[engine_of(pg)]}"


def _resolve_process_group(group_name: str) -> ProcessGroup:
    """The group registered under ``group_name``.

    Raises:
        ValueError: no group of this process has that name.
    """
    for pg, name in _world.pg_names.items():
        if name == group_name:
            return torch_object(pg)
    raise ValueError(f"Could not resolve process group {group_name!r}: no group of that name "
                     f"in this process")


def _get_pg_default_device(group: ProcessGroup | None = None) -> torch.device:
    """The device of ``group``'s object collectives: the CPU (ringtorch's backends are CPU).
    Deprecated, as in torch."""
    warnings.warn("`_get_pg_default_device` will be deprecated, it only stays for "
                  "backward-compatibility reason. If you need to find a device for object "
                  "collectives, please use `_get_object_coll_device`. If you need to query "
                  "the device types supported by group, please use `_device_capability(group)`. ",
                  FutureWarning, stacklevel=2)
    if group is None:
        _get_default_group()  # raises before init_process_group, as torch
    return torch.device("cpu")


def _object_to_tensor(obj: Any, device: Any, group: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``obj`` pickled into a uint8 tensor on ``device``, and its length as a 1-element long
    tensor (what torch's object collectives send)."""
    buf = io.BytesIO()
    pickle.Pickler(buf).dump(obj)
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8).to(device)
    return data, torch.tensor([data.numel()], dtype=torch.long, device=device)


def _tensor_to_object(tensor: torch.Tensor, tensor_size: Any, group: Any) -> Any:
    """The object :func:`_object_to_tensor` pickled into ``tensor`` (its first ``tensor_size``
    bytes). Unpickling runs code chosen by whoever wrote the bytes: use it only on tensors
    received from authenticated peers (ringtorch's connections are)."""
    data = tensor.cpu().numpy().tobytes()[:int(tensor_size)]
    return pickle.Unpickler(io.BytesIO(data)).load()


def _store_based_barrier(rank: int, store: Any, group_name: str, rendezvous_count: int,
                         timeout: timedelta,
                         logging_interval: timedelta = timedelta(seconds=10)) -> None:
    """Block until ``rendezvous_count`` ranks of group ``group_name`` checked in through
    ``store`` (torch's barrier after ``init_process_group``/``new_group``).

    Raises:
        DistStoreError: not every rank arrived within ``timeout``; the message says how many.
    """
    _init_barrier(rank, store, group_name, rendezvous_count, timeout)


__all__ = [
    "shrink_group",
    "AllToAllOptions",
    "AllreduceCoalescedOptions",
    "AllreduceOptions",
    "Backend",
    "BackendConfig",
    "BarrierOptions",
    "BroadcastOptions",
    "DebugLevel",
    "GatherOptions",
    "GroupMember",
    "GroupName",
    "P2POp",
    "PrefixStore",
    "ProcessGroup",
    "ReduceOp",
    "ReduceOptions",
    "ReduceScatterOptions",
    "ScatterOptions",
    "Store",
    "Work",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "record_comm",
    "default_pg_timeout",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_backend",
    "get_backend_config",
    "get_debug_level",
    "get_default_backend_for_device",
    "get_global_rank",
    "get_group_rank",
    "get_node_local_rank",
    "get_pg_count",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "irecv",
    "is_backend_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "is_ucc_available",
    "is_xccl_available",
    "isend",
    "monitored_barrier",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_op",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
    "split_group",
    "supports_complex",
]

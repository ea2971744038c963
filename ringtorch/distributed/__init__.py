"""ringtorch.distributed: torch.distributed's API, on ringtorch's own backends and stores.

Change ``import torch.distributed as dist`` to ``import ringtorch.distributed as dist`` and
keep the program: the names, signatures, defaults and errors are torch's. ``backend="gloo"``
selects ringtorch's native CPU backend (ours, in gloo's role: it is not the gloo library).
This module only re-exports; like torch's it does not import rpc, autograd or optim.
"""

from __future__ import annotations

from ringtorch._errors import (
    DistBackendError,
    DistError,
    DistNetworkError,
    DistStoreError,
    QueueEmptyError,
)
from ringtorch.collectives.options import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.collectives.reduce_op import ReduceOp
from ringtorch.collectives.shrink_agree import ShrinkRefusedError
from ringtorch.collectives.work import Work

# The submodule rendezvous.py is loaded here, before the function of the same name is bound:
# imported later, it would replace ringtorch.distributed.rendezvous (the function, as in
# torch) with the module.
from ringtorch.distributed import rendezvous as _rendezvous_module  # noqa: F401
from ringtorch.distributed._backend import (
    Backend,
    BackendConfig,
    get_default_backend_for_device,
    is_backend_available,
    is_gloo_available,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    is_ucc_available,
    is_xccl_available,
)
from ringtorch.distributed._breakpoint import breakpoint
from ringtorch.distributed._debug import (
    DebugLevel,
    get_debug_level,
    set_debug_level,
    set_debug_level_from_env,
)
from ringtorch.distributed._grad_bucket import GradBucket
from ringtorch.distributed._profiling import record_comm
from ringtorch.distributed._world import GroupMember, GroupName, RankType, group
from ringtorch.distributed.deprecated_ops import (
    all_gather_coalesced,
    all_gather_into_tensor,
    all_reduce_coalesced,
    reduce_op,
    reduce_scatter_tensor,
)
from ringtorch.distributed.groups import (
    default_pg_timeout,
    destroy_process_group,
    get_backend,
    get_backend_config,
    get_global_rank,
    get_group_rank,
    get_node_local_rank,
    get_pg_count,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    init_process_group,
    is_initialized,
    new_group,
)
from ringtorch.distributed.grow import (
    GrownWorld,
    JoinError,
    admit_joiners,
    broadcast_module_state,
    broadcast_optimizer_state,
    joined_running_job,
)
from ringtorch.distributed.object_ops import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from ringtorch.distributed.ops import (
    all_gather,
    all_gather_single,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    monitored_barrier,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    scatter,
    supports_complex,
)
from ringtorch.distributed.p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from ringtorch.distributed.recovery import ShrunkWorld, shrink_on_failure
from ringtorch.distributed.shrink import shrink_group
from ringtorch.distributed.subgroups import (
    new_subgroups,
    new_subgroups_by_enumeration,
    split_group,
)
from ringtorch.rendezvous import register_rendezvous_handler, rendezvous
from ringtorch.store import FileStore, HashStore, PrefixStore, Store, TCPStore


def is_available() -> bool:
    """Whether the distributed package is available: always, with ringtorch."""
    return True


__all__ = [
    "GrownWorld",
    "JoinError",
    "ShrinkRefusedError",
    "ShrunkWorld",
    "admit_joiners",
    "broadcast_module_state",
    "broadcast_optimizer_state",
    "joined_running_job",
    "shrink_group",
    "shrink_on_failure",
    "AllToAllOptions",
    "AllgatherOptions",
    "AllreduceCoalescedOptions",
    "AllreduceOptions",
    "Backend",
    "BackendConfig",
    "BarrierOptions",
    "BroadcastOptions",
    "DebugLevel",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "FileStore",
    "GatherOptions",
    "GradBucket",
    "GroupMember",
    "GroupName",
    "HashStore",
    "P2POp",
    "PrefixStore",
    "ProcessGroup",
    "QueueEmptyError",
    "RankType",
    "ReduceOp",
    "ReduceOptions",
    "ReduceScatterOptions",
    "ScatterOptions",
    "Store",
    "TCPStore",
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
    "breakpoint",
    "broadcast",
    "broadcast_object_list",
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
    "is_available",
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
    "record_comm",
    "reduce",
    "reduce_op",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "register_rendezvous_handler",
    "rendezvous",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
    "set_debug_level",
    "set_debug_level_from_env",
    "split_group",
    "supports_complex",
]

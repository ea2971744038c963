"""Creating, naming, querying and destroying process groups, with torch's functions and errors.

``init_process_group`` makes the default group from a store (given, or made by rendezvous on
``init_method``, ``env://`` by default); ``new_group`` makes subgroups. Every rank must call
``new_group`` in the same order, members or not: group names come from a counter every rank
advances ("0" is the default group, then "1", "2", ...), and each group's backend meets its
peers under its name in the store. A rank outside a group gets ``GroupMember.NON_GROUP_MEMBER``.
``destroy_process_group()`` undoes everything, so a later ``init_process_group`` in the same
process works and gets the same names.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import warnings
from datetime import timedelta
from typing import Any

from ringtorch import _config
from ringtorch._observe import trace_run
from ringtorch._observe.hang_ask import HANG
from ringtorch._observe.totals import TOTALS
from ringtorch.collectives import liveness
from ringtorch.collectives.backends import registry
from ringtorch.collectives.backends.base import BackendContext
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.distributed import _debug, _torch_world, flight_recorder
from ringtorch.distributed._backend import Backend, BackendConfig
from ringtorch.distributed._grow_join import (
    close_to_joiners,
    generation_prefix,
    join_running_job,
)
from ringtorch.distributed._init_device import check_device_id, runs_nccl
from ringtorch.distributed._world import NON_GROUP_MEMBER, GroupMember, _world, is_non_member
from ringtorch.store import HashStore, PrefixStore, Store

log = logging.getLogger(__name__)

default_pg_timeout = timedelta(minutes=30)
"""torch's default timeout of a process group's operations (``default_pg_timeout``)."""


def _check_valid_timeout(timeout: Any) -> None:
    if not isinstance(timeout, timedelta):
        raise TypeError(f"Expected timeout argument to be of type datetime.timedelta, got "
                        f"{timeout}")


def _get_default_group() -> ProcessGroup:
    if _world.default_pg is None:
        # a program that initialized through the backend door: torch's default group's engine
        door = _torch_world.torch_default_engine()
        if door is not None:
            return door
        raise ValueError("Default process group has not been initialized, please make sure to "
                         "call init_process_group.")
    return _world.default_pg


def _get_default_store() -> Any:
    return _world.pg_map[_get_default_group()][1]


def is_initialized() -> bool:
    """Whether the default process group has been initialized."""
    return _world.default_pg is not None


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: timedelta | None = None, world_size: int = -1, rank: int = -1,
                       store: Store | None = None, group_name: str = "",
                       pg_options: Any | None = None, device_id: Any = None) -> None:
    """Initialize the default process group (and with it the distributed package).

    Give either ``store`` with ``rank`` and ``world_size``, or ``init_method`` (a URL:
    ``env://`` (the default), ``tcp://host:port``, ``file:///path``); the call blocks until
    every rank has joined. ``backend="gloo"`` (or None, or ``"ringtorch"``) selects
    ringtorch's native CPU backend, which plays gloo's role; ``"mpi"`` needs mpi4py and an
    MPI launcher; ``"nccl"`` (and a map such as ``"cpu:gloo,cuda:nccl"``) runs CUDA tensors
    on NCCL once its device feature is open (docs/gpu.md; until then the error says it is not
    available), and ``device_id`` may then name a CUDA device (its communicator is made at
    once). ``group_name`` is ignored, as in torch. A group on the native backend is torch's
    default group too (backend "ringtorch" there), so torch's DeviceMesh, DTensor, FSDP and
    DCP run on it, unless torch had a default group of its own already (docs/modern-stack.md,
    "One world").

    Raises:
        ValueError: the default group exists already ("trying to initialize the default
            process group twice!"), or ``device_id`` is a device no backend of the group
            runs.
        TypeError: ``timeout`` is not a ``timedelta``.
        RuntimeError: the backend is unknown or not available here.
    """
    if _world.default_pg is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if store is not None and init_method is not None:
        raise AssertionError("Cannot specify both init_method and store.")
    if store is not None:
        if not world_size > 0:
            raise AssertionError("world_size must be positive if using store")
        if not rank >= 0:
            raise AssertionError("rank must be non-negative if using store")
    elif init_method is None:
        init_method = "env://"
    device_id = check_device_id(device_id)
    if backend is None and device_id is not None and device_id.type == "cuda":
        backend = Backend.NCCL  # torch: the default backend of the bound device's type
    # As in torch, get_backend() then reports "undefined" when no backend was named; the
    # group runs on the CPU backend ("gloo": ringtorch's native backend).
    backend_str = Backend(backend if backend is not None else "undefined")
    config = BackendConfig(backend_str)
    if device_id is not None and device_id.type == "cuda" and not runs_nccl(str(config)):
        raise ValueError(f"device_id {device_id} is not available: backend {str(backend_str)!r} "
                         f"has no backend for cuda tensors")
    impl_name = config.cpu_backend()
    if timeout is None:
        timeout = registry.default_timeout(backend_str)
    _check_valid_timeout(timeout)
    registry.require(impl_name)  # an unavailable backend fails before any rendezvous
    if impl_name == Backend.MPI:
        rank, world_size, store = _mpi_world(rank, world_size)
    elif store is None:
        from ringtorch.rendezvous import rendezvous

        assert init_method is not None
        store, rank, world_size = next(rendezvous(init_method, rank, world_size,
                                                  timeout=timeout))
        store.set_timeout(timeout)
    joining = _config.JOIN.get() and impl_name != Backend.MPI
    slot = rank  # as started (a replacement's rank in the grown world may differ)
    if joining:  # a replacement worker: join the running job instead of meeting a new one
        pg, store = join_running_job(store, rank, timeout, _make_group)
        rank, world_size, name = pg.rank(), pg.size(), pg.group_name
    else:
        store = PrefixStore(_default_prefix(store, rank), store)
        name = _world.next_group_name()
        try:
            pg = _make_group(world_size, rank, list(range(world_size)), impl_name,
                             str(backend_str), store, name, timeout, "default_pg", pg_options,
                             str(config), device_id=device_id)
        except BaseException:
            _world.reset()  # nothing of a failed init stays: a later one starts from group "0"
            raise
        _world.default_pg = pg
    _world.init_method = init_method
    _torch_world.publish_default(pg, impl_name, store, _torch_subgroup)  # torch's world too
    HANG.install(store.underlying_store, slot, world_size, flight_recorder.dump)  # hang reports
    if joining:  # its reports ask the grown world, and name ranks by both numbers
        HANG.renumber(rank, list(pg.global_ranks))
    _install_excepthook(rank)
    if not joining:  # the timeline meets the job's first ranks only (docs/recovery.md)
        trace_run.start_if_asked(None if impl_name == Backend.MPI else store, rank, world_size)
    TOTALS.install(rank)  # running totals for the end-of-job summary
    if os.environ.get("TORCH_DIST_INIT_BARRIER", "0") == "1" and not joining:
        _store_based_barrier(rank, store, name, world_size, timeout)


def _default_prefix(store: Any, rank: int) -> str:
    """torch's "default_pg" store prefix, made unique per re-initialization.

    After ``destroy_process_group()`` a program may initialize again on the same store (the
    same ``MASTER_PORT``), whose keys from the previous incarnation may still be there: group
    "0" would then meet stale addresses. Each rank counts its initializations in the store;
    every rank re-initializes the same number of times, so the counts agree and the n-th
    incarnation uses "default_pg/n" (the first keeps torch's "default_pg").
    """
    return generation_prefix(store.add(f"rt_init_generation/{rank}", 1))


def _mpi_world(rank: int, world_size: int) -> tuple[int, int, Any]:
    """Rank and size as the MPI runtime assigned them (torch ignores the given ones)."""
    if world_size != -1 or rank != -1:
        warnings.warn(f"For MPI backend, world_size ({world_size}) and rank ({rank}) are "
                      f"ignored since they are assigned by the MPI runtime.", stacklevel=3)
    from ringtorch.collectives.backends import mpi_env

    rank, world_size = mpi_env.world_rank_and_size()  # warns when no MPI launcher started us
    return rank, world_size, HashStore()


def _make_group(size: int, rank: int, global_ranks: list[int], impl_name: str,
                backend_name: str, base_store: Any, group_name: str, timeout: timedelta,
                group_desc: str, pg_options: Any, backend_config: str,
                setup_timeout: timedelta | None = None, device_id: Any = None) -> ProcessGroup:
    """Create one group's backend (this blocks until its members have met, for at most
    ``setup_timeout``, default ``timeout``) and register it; a map that runs CUDA tensors on
    "nccl" gives the group its NCCL side too (made now on ``device_id``, else at its first
    operation on device tensors)."""
    store = PrefixStore(f"{group_name}/", base_store)
    if impl_name != Backend.MPI and size > 1:
        liveness.register(store, rank)  # for shrink_group's agreement, should a member die
    ctx = BackendContext(store=store, rank=rank, size=size, timeout=timeout,
                         group_name=group_name, global_ranks=tuple(global_ranks),
                         setup_timeout=setup_timeout)
    impl = registry.create(impl_name, ctx, pg_options)
    pg = ProcessGroup(store, rank, size, backend=impl, backend_name=impl_name,
                      group_name=group_name, group_desc=group_desc, timeout=timeout,
                      global_ranks=global_ranks)
    if runs_nccl(backend_config):
        from ringtorch.distributed._nccl import NcclGroup

        if device_id is None and _world.default_pg is not None:
            device_id = _world.default_pg.bound_device_id
        pg.bound_device_id = device_id
        try:
            pg.device_backend = NcclGroup(store, rank, size, timeout, group_name,
                                          tuple(global_ranks),
                                          device_id.index if device_id is not None else None)
        except BaseException:
            pg.abort()
            raise
    if impl_name != Backend.MPI:
        _debug.install(pg)
    _world.register(pg, backend_name, store, global_ranks, backend_config)
    return pg


def _install_excepthook(rank: int) -> None:
    """Prefix each line of an uncaught exception's report with ``[rank<N>]:``, as torch does."""
    old_hook = sys.excepthook
    prefix = f"[rank{rank}]"

    def hook(*args: Any) -> None:
        old_stderr = sys.stderr
        sys.stderr = buf = io.StringIO()
        try:
            old_hook(*args)
        finally:
            sys.stderr = old_stderr
        text = "\n".join(f"{prefix}: {line}" if line else "" for line in buf.getvalue().split("\n"))
        sys.stderr.write(text)
        sys.stderr.flush()

    if _world.saved_excepthook is None:
        _world.saved_excepthook = old_hook
    sys.excepthook = hook


def _store_based_barrier(rank: int, store: Any, group_name: str, world_size: int,
                         timeout: timedelta) -> None:
    """torch's TORCH_DIST_INIT_BARRIER=1 barrier: every rank checks in through the store."""
    key = f"store_based_barrier_key:{group_name}"
    store.add(key, 1)
    if store.add(key, 0) == world_size:
        store.set(f"{key}:last_worker", "1")
    try:
        store.wait([f"{key}:last_worker"], timeout)
    except Exception as exc:
        from ringtorch._errors import DistStoreError

        joined = store.add(key, 0)
        raise DistStoreError(
            f"Timed out initializing process group in store based barrier on rank {rank}, for "
            f"key: {key} (world_size={world_size}, num_workers_joined={joined}, "
            f"timeout={timeout} error={exc})") from exc


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Destroy ``group``; with no group (or ``group.WORLD``), every group and the package
    state, so that ``init_process_group`` can be called again in this process.

    Raises:
        ValueError: ``group`` is not a live group of this process.
    """
    if is_non_member(group):
        return
    pg = _world.default_pg if group is None else _torch_world.engine_of(group)
    if pg is None:
        raise AssertionError("Process group cannot be None")
    if pg not in _world.pg_map:
        raise ValueError("Invalid process group specified")
    if group is None or pg is _world.default_pg:
        close_to_joiners(pg)  # rank 0: no replacement worker waits for a job that ended
        trace_run.finish()  # before shutdown: the records still know their route
        TOTALS.write()  # the end-of-job summary's totals, in case the process is killed later
        for each in sorted(_world.pg_names, key=lambda g: int(_world.pg_names[g])
                           if _world.pg_names[g].isdigit() else -1, reverse=True):
            each.shutdown()
        _torch_world.withdraw_all()  # torch's world, and the groups torch's code made there
        _world.reset()
        HANG.uninstall()
    else:
        pg.shutdown()
        _torch_world.withdraw(pg)
        _world.forget(pg)


def get_rank(group: ProcessGroup | None = None) -> int:
    """This process's rank in ``group`` (the default group if None); -1 for a non-member."""
    if is_non_member(group):
        return -1
    default = _get_default_group()
    if group is None or group is GroupMember.WORLD:
        return default.rank()
    return get_group_rank(group, default.rank())


def get_world_size(group: ProcessGroup | None = None) -> int:
    """The number of ranks in ``group`` (the default group if None); -1 for a non-member."""
    if is_non_member(group):
        return -1
    if group is None or group is GroupMember.WORLD:
        return _get_default_group().size()
    return _torch_world.engine_of(group).size()


def get_backend(group: ProcessGroup | None = None) -> str:
    """The backend name of ``group`` as a lowercase string ("gloo").

    Raises:
        ValueError: this rank is not in ``group``, or ``group`` is not a live group.
    """
    pg = _torch_world.engine_of(group) or _get_default_group()
    if is_non_member(pg):
        raise ValueError("Invalid process group specified")
    entry = _world.pg_map.get(pg)
    if entry is None and _torch_world.door_ranks(pg) is not None:
        return Backend(pg.name())  # a group torch made through the backend door
    if entry is None:
        raise ValueError(f"Process group {pg} is not initialized in the world group map. Please "
                         f"initialize the group first.")
    return Backend(entry[0])


def get_backend_config(group: ProcessGroup | None = None) -> str:
    """The backend configuration of ``group`` ("cpu:gloo")."""
    pg = _torch_world.engine_of(group) or _get_default_group()
    if is_non_member(pg):
        raise ValueError("Invalid process group specified")
    if pg not in _world.pg_backend_config and _torch_world.door_ranks(pg) is not None:
        return f"cpu:{pg.name()}"  # a group torch made through the backend door
    return _world.pg_backend_config[pg]


def get_group_rank(group: ProcessGroup, global_rank: int) -> int:
    """Translate a global rank into ``group``'s rank.

    Raises:
        ValueError: ``group`` is not registered, or ``global_rank`` is not in it.
    """
    if group is GroupMember.WORLD:
        return global_rank
    ranks = _ranks_of(group)
    if global_rank not in ranks:
        raise ValueError(f"Global rank {global_rank} is not part of group {group}")
    return ranks[global_rank]


def get_global_rank(group: ProcessGroup, group_rank: int) -> int:
    """Translate ``group``'s rank into a global rank.

    Raises:
        ValueError: ``group`` is not registered, or has no rank ``group_rank``.
    """
    if group is GroupMember.WORLD:
        return group_rank
    for glob, local in _ranks_of(group).items():
        if local == group_rank:
            return glob
    raise ValueError(f"Group rank {group_rank} is not part of group {group}")


def get_process_group_ranks(group: ProcessGroup | None) -> list[int]:
    """The global ranks of ``group``'s members, in group-rank order."""
    return list(_ranks_of(group or _get_default_group()).keys())


def _ranks_of(group: Any) -> dict[int, int]:
    """global rank -> group rank of ``group`` (the facade's, or torch's object for one).

    Raises:
        ValueError: ``group`` is not a group of this process.
    """
    pg = _torch_world.engine_of(group)
    ranks = _world.pg_group_ranks.get(pg)
    if ranks is None:
        ranks = _torch_world.door_ranks(pg)
    if ranks is None:
        raise ValueError(f"Group {group} is not registered, please create group with "
                         f"torch.distributed.new_group API")
    return ranks


def get_pg_count() -> int:
    """How many process groups have been created (the group-name counter)."""
    return _world.group_count


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """The rank of this process on its node (``LOCAL_RANK``), else ``fallback_rank``."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("LOCAL_RANK is not in the environment. Consider passing fallback_rank to "
                       "allow `get_node_local_rank` to work, assuming you are not running in a "
                       "multi-device context and want the code to run locally instead.")


def new_group(ranks: list[int] | None = None, timeout: timedelta | None = None,
              backend: str | None = None, pg_options: Any | None = None,
              use_local_synchronization: bool = False, group_desc: str | None = None,
              device_id: Any = None, sort_ranks: bool = True) -> Any:
    """Create a group of ``ranks`` (global ranks; all ranks if None).

    Every rank of the default group must call it, in the same order as the others, members
    or not. Returns the new group, or ``GroupMember.NON_GROUP_MEMBER`` on ranks outside it
    (None with ``use_local_synchronization``, where only members call it).

    Raises:
        ValueError: a rank out of range or listed twice, or more ranks than the world.
        TypeError: ``timeout`` is not a ``timedelta``.
    """
    default = _get_default_group()
    check_device_id(device_id)
    default_backend, default_store = _world.pg_map[default]
    backend = Backend(backend) if backend else default_backend
    impl_name = BackendConfig(backend).cpu_backend()
    if timeout is None:
        timeout = registry.default_timeout(backend)
    _check_valid_timeout(timeout)
    my_rank, world = default.rank(), default.size()
    if use_local_synchronization and impl_name == Backend.MPI:
        # members name the group after their own histories; MPI needs them to agree (torch too)
        raise ValueError("MPI backend doesn't support use_local_synchronization=True")
    if use_local_synchronization and ranks is not None and my_rank not in ranks:
        return None
    if ranks is None:
        ranks = list(range(world))
    else:
        ranks = sorted(ranks) if sort_ranks else list(ranks)
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"ranks list must not contain duplicate entries, got {ranks}")
        if len(ranks) > world:
            raise ValueError("the new group's world size should be less or equal to the world "
                             "size set by init_process_group")
        for r in ranks:
            if not isinstance(r, int) or r < 0 or r >= world:
                raise ValueError(f"Rank {r} is out of range. Valid ranks are 0 to {world - 1} "
                                 f"(world_size={world})")
    if use_local_synchronization:
        import hashlib

        joined = "_".join(map(str, ranks)) + "_" + str(len(_world.pg_names))
        name = hashlib.sha1(joined.encode(), usedforsecurity=False).hexdigest()
    else:
        name = _world.next_group_name()
        _torch_world.follow_count()
    if my_rank not in ranks:
        return NON_GROUP_MEMBER
    registry.require(impl_name)
    pg = _make_group(len(ranks), ranks.index(my_rank), ranks, impl_name, str(backend),
                     default_store, name, timeout,
                     group_desc if group_desc is not None else "undefined", pg_options,
                     str(BackendConfig(backend)))
    _torch_world.publish(pg, impl_name, ranks)
    return _torch_world.torch_object(pg)


def _torch_subgroup(ranks: list[int], name: str, timeout: timedelta | None, pg_options: Any,
                    group_desc: str | None) -> Any:
    """torch's object for the subgroup torch's ``new_group`` asked the default group for
    (named by torch, every rank calling, ranks checked by torch), made like ``new_group``'s
    on the default group's backend; None on a rank outside it."""
    _torch_world.follow_torch_count()
    default = _get_default_group()
    backend, default_store = _world.pg_map[default]
    if default.rank() not in ranks:
        return None
    pg = _make_group(len(ranks), ranks.index(default.rank()), ranks,
                     BackendConfig(backend).cpu_backend(), str(backend), default_store, name,
                     timeout or registry.default_timeout(backend),
                     group_desc if group_desc is not None else "undefined", pg_options,
                     str(BackendConfig(backend)))
    return _torch_world.subgroup_made_for_torch(pg)


__all__ = [
    "default_pg_timeout",
    "destroy_process_group",
    "get_backend",
    "get_backend_config",
    "get_global_rank",
    "get_group_rank",
    "get_node_local_rank",
    "get_pg_count",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_initialized",
    "new_group",
]

"""RingtorchGroup: a ``torch.distributed.ProcessGroup`` whose operations run on the engine.

torch's ``_new_process_group_helper`` calls the backend's creator (``create``) with its own
store, the group's rank and size, timeout, name and global ranks; a creator that returns a
ProcessGroup subclass becomes the group itself (as torch's tests' Python groups do). Every
operation torch's Python code or C++ (functional collectives, through torch's trampoline)
calls is a method here with torch's name and arguments: it translates torch's options
(options.py), calls the same method of a ``ringtorch.collectives.ProcessGroup`` and wraps the
engine's Work in torch's (work.py). Argument checks, errors, ordering, failure detection and
the flight recorder are the engine's, the same as through ``ringtorch.distributed``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ringtorch.c10d import observe
from ringtorch.c10d.options import translate
from ringtorch.c10d.torch_store import TorchStore
from ringtorch.c10d.work import DoorWork, door_work
from ringtorch.collectives import liveness
from ringtorch.collectives import options as o
from ringtorch.collectives.backends import registry
from ringtorch.collectives.backends.base import BackendContext
from ringtorch.collectives.process_group import ProcessGroup
from ringtorch.collectives.work import joined_work
from ringtorch.store import PrefixStore

NAME = "ringtorch"


class RingtorchGroup(dist.ProcessGroup):
    """torch's ProcessGroup for backend "ringtorch" (made by ``create``).

    Args:
        engine: the engine's group (its rank and size are this group's).
        base: torch's store the group's members met through (where a shrunk group meets).
    """

    def __init__(self, engine: ProcessGroup, base: TorchStore | None = None) -> None:
        super().__init__(engine.rank(), engine.size())
        self._engine = engine
        self._base = base
        self._coalesced: list[Any] | None = None  # the Works of an open coalescing block
        self._name = engine.group_name
        self._desc = engine.group_desc

    @property
    def engine(self) -> ProcessGroup:
        """The engine's group that runs this group's operations."""
        return self._engine

    @property
    def base_store(self) -> TorchStore | None:
        """torch's store the group's members met through (None for a group that
        ``ringtorch.distributed`` made: its members met through ringtorch's store)."""
        return self._base

    def _opts(self, kind: type, opts: Any, default: Callable[[], Any]) -> Any:
        """The engine's options (class ``kind``) for torch's ``opts`` (``default()``: torch's
        own class, when None); inside a coalescing block every call queues."""
        if opts is None:
            opts = default()
        return translate(kind, opts, True if self._coalesced is not None else None)

    def _w(self, work: Any, opts: Any = None) -> Any:
        """torch's Work for the engine's; None for a synchronous call, done here.

        torch's functions accept None from a backend that completed a synchronous call
        itself ("backends that sync at CPP level"): waiting on the engine's Work directly
        spares the call a torch Work object and a layer of waiting.
        """
        if self._coalesced is not None:
            self._coalesced.append(work)
        elif opts is not None and not opts.asyncOp:
            work.wait()
            return None
        return door_work(work)

    # -- what the group is ------------------------------------------------------------------

    def getBackendName(self) -> str:
        return NAME

    def name(self) -> str:
        return NAME

    # torch keeps a group's name in its backends; a Python group keeps its own
    def _set_group_name(self, name: str) -> None:
        self._name = name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    def getGroupName(self) -> str:
        return self._name

    def getGroupDesc(self) -> str:
        return self._desc

    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device("cpu")]

    # torch asks a group for its backend object of a device and then for what that backend
    # supports; this group is its own CPU backend, and supports none of those extras
    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False
    # torch.distributed.shrink_group reaches ``shrink`` below, which names the call that works
    # (a torch without shrink_group is offered nothing)
    supports_shrinking = hasattr(dist, "shrink_group")

    def shrink(self, ranks_to_exclude: Any, shrink_flags: int = 0,
               opts_override: Any = None) -> Any:
        """torch.distributed.shrink_group's backend step, which a group written in Python
        cannot take: torch wraps the backend it returns in a C++ ProcessGroup whose
        ``_register_backend`` accepts only a C++ ``c10d::Backend``."""
        raise TypeError(
            f"Process group backend for '{self._name}' does not support shrinking operations "
            f"through torch.distributed.shrink_group: torch wraps the shrunk backend in its own "
            f"C++ ProcessGroup, which cannot hold a backend written in Python. Call "
            f"ringtorch.c10d.shrink_group with the same arguments (it shrinks the group and "
            f"registers the new one with torch.distributed as torch's function does).")

    def _get_backend(self, device: Any = None) -> RingtorchGroup:
        return self

    def _get_sequence_number_for_group(self) -> int:
        return self._engine._get_sequence_number_for_group()

    def _set_sequence_number_for_group(self) -> None:
        """Sequence numbers start at zero on every rank already."""

    def set_timeout(self, timeout: timedelta) -> None:
        self._engine.set_timeout(timeout)

    def __repr__(self) -> str:
        return f"<RingtorchGroup {self._engine!r}>"

    # -- reductions -------------------------------------------------------------------------

    def allreduce(self, tensors: Any, opts: Any = None) -> Any:
        eo = self._opts(o.AllreduceOptions, opts, dist.AllreduceOptions)
        return self._w(self._engine.allreduce(list(tensors), eo), eo)

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> Any:
        eo = self._opts(o.AllreduceCoalescedOptions, opts, dist.AllreduceCoalescedOptions)
        return self._w(self._engine.allreduce_coalesced(list(tensors), eo), eo)

    def reduce(self, tensors: Any, opts: Any = None) -> Any:
        eo = self._opts(o.ReduceOptions, opts, dist.ReduceOptions)
        return self._w(self._engine.reduce(list(tensors), eo), eo)

    def reduce_scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        eo = self._opts(o.ReduceScatterOptions, opts, dist.ReduceScatterOptions)
        return self._w(self._engine.reduce_scatter(
            list(outputs), [list(i) for i in inputs],
            eo), eo)

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        eo = self._opts(o.ReduceScatterOptions, opts, dist.ReduceScatterOptions)
        return self._w(self._engine.reduce_scatter_single(output, input, eo), eo)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs: Any, inputs: Any,
                                        opts: Any = None) -> Any:
        eo = self._opts(o.ReduceScatterOptions, opts, dist.ReduceScatterOptions)
        return self._w(self._engine.reduce_scatter_tensor_coalesced(
            list(outputs), list(inputs),
            eo), eo)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    # -- data movement ----------------------------------------------------------------------

    def broadcast(self, tensors: Any, opts: Any = None) -> Any:
        eo = self._opts(o.BroadcastOptions, opts, dist.BroadcastOptions)
        return self._w(self._engine.broadcast(list(tensors), eo), eo)

    def allgather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        eo = self._opts(o.AllgatherOptions, opts, _AllgatherOptions)
        return self._w(self._engine.allgather(
            [list(x) for x in outputs], list(inputs),
            eo), eo)

    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        eo = self._opts(o.AllgatherOptions, opts, _AllgatherOptions)
        return self._w(self._engine.all_gather_single(output, input, eo), eo)

    _allgather_base = all_gather_single

    def allgather_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        eo = self._opts(o.AllgatherOptions, opts, _AllgatherOptions)
        return self._w(self._engine.allgather_coalesced(
            [list(x) for x in outputs], list(inputs),
            eo), eo)

    def allgather_into_tensor_coalesced(self, outputs: Any, inputs: Any,
                                        opts: Any = None) -> Any:
        eo = self._opts(o.AllgatherOptions, opts, _AllgatherOptions)
        return self._w(self._engine.allgather_into_tensor_coalesced(list(outputs), list(inputs), eo), eo)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def gather(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        eo = self._opts(o.GatherOptions, opts, dist.GatherOptions)
        return self._w(self._engine.gather(
            [list(x) for x in outputs], list(inputs),
            eo), eo)

    def scatter(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        eo = self._opts(o.ScatterOptions, opts, dist.ScatterOptions)
        return self._w(self._engine.scatter(
            list(outputs), [list(x) for x in inputs],
            eo), eo)

    def alltoall(self, outputs: Any, inputs: Any, opts: Any = None) -> Any:
        eo = self._opts(o.AllToAllOptions, opts, dist.AllToAllOptions)
        return self._w(self._engine.alltoall(list(outputs), list(inputs), eo), eo)

    def alltoall_base(self, output: Any, input: Any, output_split_sizes: Any = None,
                      input_split_sizes: Any = None, opts: Any = None) -> Any:
        eo = self._opts(o.AllToAllOptions, opts, dist.AllToAllOptions)
        return self._w(self._engine.alltoall_base(
            output, input, list(output_split_sizes or []), list(input_split_sizes or []),
            eo), eo)

    all_to_all_single = alltoall_base

    def barrier(self, opts: Any = None) -> Any:
        eo = self._opts(o.BarrierOptions, opts, dist.BarrierOptions)
        return self._w(self._engine.barrier(eo), eo)

    def monitored_barrier(self, timeout: timedelta | None = None,
                          wait_all_ranks: bool = False) -> None:
        self._engine.monitored_barrier(timeout, wait_all_ranks)

    # -- point to point ---------------------------------------------------------------------

    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> Any:
        return self._w(self._engine.send(list(tensors), dstRank, tag))

    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> Any:
        return self._w(self._engine.recv(list(tensors), srcRank, tag))

    def recv_anysource(self, tensors: Any, tag: int = 0) -> Any:
        return self._w(self._engine.recv_anysource(list(tensors), tag))

    # -- coalescing (torch's _coalescing_manager with a device) -----------------------------

    def _start_coalescing(self, device: Any = None) -> None:
        if self._coalesced is not None:
            raise RuntimeError("ProcessGroup has non-empty op list at the start of coalescing")
        self._coalesced = []

    def _end_coalescing(self, device: Any = None) -> Any:
        works, self._coalesced = self._coalesced or [], None
        return DoorWork(joined_work("coalesced", works, []))

    # -- life cycle -------------------------------------------------------------------------

    def shutdown(self) -> None:
        observe.group_gone(self._engine)
        self._engine.shutdown()

    def abort(self) -> None:
        observe.group_gone(self._engine)
        self._engine.abort()


class FacadeGroup(RingtorchGroup):
    """A group ``ringtorch.distributed`` made, as torch's world holds it and the facade hands
    it out. What the engine's group has and torch's does not (``global_ranks``,
    ``shares_memory``, ...) reads through to the engine's group, for ringtorch's own code
    above the facade (DDP's reducer) that holds this object."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_engine":
            raise AttributeError(name)
        return getattr(self._engine, name)


class WorldGroup(FacadeGroup):
    """A group that ``ringtorch.distributed.init_process_group`` made, as torch's default
    group: torch's ``new_group`` (and with it DeviceMesh) hands subgroup creation to a
    default group with a ``new_group`` method, and this one hands it to the facade.

    Args:
        engine: the facade's default group.
        make_subgroup: ``make_subgroup(ranks, group_name, timeout, pg_options, group_desc)``
            returns torch's object for the new subgroup, or None on a rank outside it.
    """

    def __init__(self, engine: ProcessGroup, make_subgroup: Callable[..., Any]) -> None:
        super().__init__(engine)
        self._make_subgroup = make_subgroup

    def new_group(self, ranks: list[int], timeout: timedelta | None = None,
                  pg_options: Any = None, group_name: str | None = None,
                  group_desc: str | None = None) -> FacadeGroup | None:
        """torch's subgroup ``group_name`` of global ``ranks`` (torch enters it in its
        world); None on a rank outside it (torch then returns ``NON_GROUP_MEMBER``)."""
        return self._make_subgroup(list(ranks), str(group_name), timeout, pg_options,
                                   group_desc)


def _AllgatherOptions() -> Any:
    return dist.distributed_c10d.AllgatherOptions()


def create(backend_opts: Any, pg_options: Any = None) -> RingtorchGroup:
    """torch's extended-API creator of backend "ringtorch": meet the group's peers through
    torch's store (this blocks until every member arrived) and return the group."""
    rank, size = backend_opts.group_rank, backend_opts.group_size
    global_ranks = list(backend_opts.global_ranks_in_group) or list(range(size))
    base = TorchStore(backend_opts.store)
    # torch reuses a group's store keys when a program destroys its groups and initializes
    # again on the same store: each incarnation of a group name meets under its own prefix
    # (every rank creates each group as many times, so the counts agree)
    generation = base.add(f"ringtorch/incarnation/{rank}", 1)
    return RingtorchGroup(make_engine(base, f"ringtorch/{generation}", rank, size,
                                      backend_opts.timeout, str(backend_opts.group_id),
                                      global_ranks, pg_options), base)


def make_engine(base: TorchStore, prefix: str, rank: int, size: int, timeout: timedelta,
                name: str, global_ranks: list[int], pg_options: Any = None,
                setup_timeout: timedelta | None = None) -> ProcessGroup:
    """The engine's group of a door group: its members meet under ``prefix`` of torch's
    store ``base`` (within ``setup_timeout``, default ``timeout``)."""
    store = PrefixStore(prefix, base)
    if size > 1:
        liveness.register(store, rank)  # for shrink_group's agreement, should a member die
    ctx = BackendContext(store=store, rank=rank, size=size, timeout=timeout, group_name=name,
                         global_ranks=tuple(global_ranks), setup_timeout=setup_timeout)
    impl = registry.create("native", ctx, pg_options)
    engine = ProcessGroup(store, rank, size, backend=impl, backend_name=NAME, group_name=name,
                          group_desc=name, timeout=timeout, global_ranks=global_ranks)
    # a program's dist.all_reduce reaches the engine through torch's function and its logging
    # wrapper, then RingtorchGroup's method (where the facade's function would stand): the
    # flight recorder's first guess at the call site is that many frames up
    engine.site_depth = 2
    observe.group_made(engine, base)
    return engine


__all__ = ["NAME", "FacadeGroup", "RingtorchGroup", "WorldGroup", "create", "make_engine"]

"""ringtorch.distributed has torch.distributed's public surface: names, signatures, members.

torch 2.13's ``torch.distributed`` has no ``__all__``; its public surface is taken as every
name of ``dir(torch.distributed)`` that is not private and not a submodule. Every name missing
from ringtorch is printed, and must be in ``KNOWN_MISSING`` with the reason; nothing the seeds
use may be missing.
"""

from __future__ import annotations

import inspect
import types
import warnings

import pytest
import torch.distributed as tdist

import ringtorch.distributed as rdist

KNOWN_MISSING = {
    "BuiltinCommHookType": "DDP internals: ringtorch.nn.parallel has its own reducer and hooks",
    "Logger": "DDP's C++ logger",
    "Reducer": "DDP's C++ reducer: ringtorch.nn.parallel has its own",
    **dict.fromkeys(["DeviceMesh", "init_device_mesh"],
                    "torch's DeviceMesh builds torch's groups: ringtorch.distributed.device_mesh "
                    "re-exports it, on groups of either door (ringtorch.distributed's are "
                    "torch's too; docs/modern-stack.md)"),
    "ProcessGroupGloo": "the gloo library's class; ringtorch's 'gloo' is its own backend",
    "log": "torch's module logger, not API",
    "timedelta": "datetime.timedelta, imported by torch's module, not API",
}

# What the seeds' programs use (seeds 001-003), which must all be there.
SEED_SURFACE = ["init_process_group", "destroy_process_group", "get_rank", "get_world_size",
                "scatter", "gather", "reduce", "all_reduce", "broadcast", "all_gather",
                "ReduceOp", "new_group", "Backend", "group", "barrier", "is_initialized"]


def _public(module: types.ModuleType) -> set[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {n for n in dir(module) if not n.startswith("_")
                and not isinstance(getattr(module, n), types.ModuleType)}


def test_every_public_name_of_torch_distributed_is_there_or_known_missing() -> None:
    missing = sorted(_public(tdist) - _public(rdist))
    print(f"\nnames of torch.distributed missing from ringtorch.distributed ({len(missing)}):")
    for name in missing:
        print(f"  {name}: {KNOWN_MISSING.get(name, 'NOT LISTED')}")
    assert [n for n in missing if n not in KNOWN_MISSING] == []


def test_nothing_the_seeds_use_is_missing() -> None:
    for name in SEED_SURFACE:
        assert hasattr(rdist, name), name
    for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        assert getattr(rdist.ReduceOp, op) == getattr(tdist.ReduceOp, op).value, op
    assert rdist.Backend.GLOO == "gloo" and rdist.Backend("GLOO") == "gloo"


def test_all_names_resolve() -> None:
    for name in rdist.__all__:
        assert hasattr(rdist, name), name


@pytest.mark.parametrize("name", sorted(
    n for n in _public(tdist) & _public(rdist)
    if n != "reduce_op" and inspect.isfunction(getattr(tdist, n)) and n != "breakpoint"))
def test_function_signatures_match_torch(name: str) -> None:
    ours = inspect.signature(getattr(rdist, name))
    theirs = inspect.signature(getattr(tdist, name))
    want = [(p.name, p.kind, p.default) for p in theirs.parameters.values()
            if not p.name.startswith("_")]
    got = [(p.name, p.kind, p.default) for p in ours.parameters.values()]
    assert got == want
    assert getattr(rdist, name).__doc__, f"{name} has no docstring"


def test_breakpoint_takes_torchs_arguments() -> None:
    params = list(inspect.signature(rdist.breakpoint).parameters)
    assert params == list(inspect.signature(tdist.breakpoint).parameters)


def test_process_group_and_work_have_torchs_methods() -> None:
    for method in ("rank", "size", "name", "abort", "shutdown", "set_timeout", "broadcast",
                   "allreduce", "allreduce_coalesced", "reduce", "allgather", "_allgather_base",
                   "allgather_coalesced", "all_gather_single", "gather", "scatter",
                   "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
                   "alltoall_base", "alltoall", "all_to_all_single", "send", "recv",
                   "recv_anysource", "barrier", "monitored_barrier", "get_group_store",
                   "_get_sequence_number_for_group"):
        assert callable(getattr(rdist.ProcessGroup, method)), method
    for prop in ("group_name", "group_desc"):
        assert isinstance(getattr(rdist.ProcessGroup, prop), property), prop
    for method in ("wait", "is_completed", "is_success", "exception", "get_future", "result",
                   "source_rank", "_source_rank", "synchronize"):
        assert callable(getattr(rdist.Work, method)), method


def test_option_classes_have_torchs_field_names() -> None:
    for cls in ("BroadcastOptions", "AllreduceOptions", "ReduceOptions", "GatherOptions",
                "ScatterOptions", "ReduceScatterOptions", "BarrierOptions", "AllToAllOptions"):
        theirs = {n for n in dir(getattr(tdist, cls)) if not n.startswith("_")}
        ours = set(getattr(rdist, cls).__dataclass_fields__)
        assert theirs - {"device"} <= ours | {"device"}, cls


def test_debug_levels_and_group_members() -> None:
    assert [m.name for m in rdist.DebugLevel] == list(tdist.DebugLevel.__members__)
    assert rdist.GroupMember.NON_GROUP_MEMBER == tdist.GroupMember.NON_GROUP_MEMBER
    assert rdist.group.WORLD is None and rdist.GroupMember.WORLD is None
    assert rdist.default_pg_timeout == tdist.default_pg_timeout

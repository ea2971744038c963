"""Every public module of the installed torch's ``torch.distributed`` has its ringtorch
counterpart, with torch's public names and signatures, or is written down as left out.

A module is public when no component of its path after ``torch.distributed`` starts with an
underscore; its counterpart is the same path with ``torch`` replaced by ``ringtorch``. Its
public names are its ``__all__``, or without one the names it defines itself. The package
``torch.distributed`` itself is checked name by name in test_torch_surface.py.
"""

from __future__ import annotations

import importlib
import inspect
import types
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch.distributed

ROOT = Path(torch.distributed.__file__).parent

# Modules left out, by path prefix (a prefix covers its submodules), with the reason.
_FR_ANALYSER = ("torch's analyser of NCCL flight-recorder dumps; ringtorch's own records "
                "are merged by its hang report (docs/hang-report.md)")
_LATER = "a separate step: DTensor, DeviceMesh and the parallelisms built on them"
# torch's modern stack is re-exported package by package (docs/modern-stack.md); the modules
# inside a package are torch's own, reached under torch's path
_INSIDE = ("a module inside a package of torch's modern stack; the package's public names are "
           "re-exported under ringtorch's path (docs/modern-stack.md)")
LEFT_OUT = {
    **dict.fromkeys([f"torch.distributed.checkpoint.{m}" for m in (
        "api", "default_planner", "filesystem", "hf_storage", "logger", "logging_handlers",
        "metadata", "optimizer", "planner", "planner_helpers", "quantized_hf_storage",
        "resharding", "staging", "state_dict_loader", "state_dict_saver", "storage",
        "utils")], _INSIDE),
    **dict.fromkeys([f"torch.distributed.tensor.{m}" for m in (
        "debug", "device_mesh", "experimental", "placement_types", "parallel.api",
        "parallel.ddp", "parallel.fsdp", "parallel.input_reshard", "parallel.loss",
        "parallel.style")], _INSIDE),
    **dict.fromkeys([f"torch.distributed.fsdp.{m}" for m in (
        "api", "fully_sharded_data_parallel", "sharded_grad_scaler", "wrap")], _INSIDE),
    **dict.fromkeys([f"torch.distributed.pipelining.{m}" for m in (
        "microbatch", "schedules", "stage")], _INSIDE),
    "torch.distributed.flight_recorder.components": _FR_ANALYSER,
    "torch.distributed.flight_recorder.fr_trace": _FR_ANALYSER,
    "torch.distributed.config": "switches of torch.compile and torchcomms, which ringtorch "
                                "does not drive",
    "torch.distributed.c10d_logger": "torch's internal logging of c10d calls",
    "torch.distributed.logging_handlers": "torch's internal log handler table",
    "torch.distributed.collective_utils": "torch-internal helpers of distributed checkpointing",
    "torch.distributed.nn.jit": "TorchScript templates of RemoteModule; TorchScript is not "
                                "supported",
    "torch.distributed.elastic.agent": "torch's agent classes; ringtorch's agent is "
                                       "ringtorch.launcher, reached through ringrun and "
                                       "elastic_launch",
    "torch.distributed.elastic.control_plane": "torch's worker control-plane HTTP handlers",
    "torch.distributed.elastic.events": "torch elastic's event sinks; ringrun reports through "
                                        "its own failure summary",
    "torch.distributed.elastic.metrics": "torch elastic's metric sinks (same reason)",
    "torch.distributed.elastic.multiprocessing.api": "torch's process contexts; ringtorch's "
                                                     "supervision is ringtorch._workers",
    "torch.distributed.elastic.multiprocessing.redirects": "torch's process contexts (same)",
    "torch.distributed.elastic.multiprocessing.subprocess_handler": "torch's process contexts "
                                                                    "(same)",
    "torch.distributed.elastic.multiprocessing.tail_log": "torch's process contexts (same)",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend": "implementation of torch's "
        "c10d backend; ringrun's c10d backend is built into its agent",
    "torch.distributed.elastic.rendezvous.dynamic_rendezvous": "implementation of torch's c10d "
        "and etcd backends (same)",
    "torch.distributed.elastic.rendezvous.static_tcp_rendezvous": "implementation of torch's "
        "static backend; ringrun's is built into its agent",
    "torch.distributed.elastic.rendezvous.etcd_rendezvous": "etcd backends are not supported",
    "torch.distributed.elastic.rendezvous.etcd_rendezvous_backend": "etcd backends are not "
                                                                    "supported",
    "torch.distributed.elastic.rendezvous.etcd_server": "etcd backends are not supported",
    "torch.distributed.elastic.rendezvous.etcd_store": "etcd backends are not supported",
    "torch.distributed.elastic.utils.process_state": "torch agent's /proc helpers",
    "torch.distributed.optim.apply_optimizer_in_backward": "optimizer-in-backward hooks of "
                                                           "FSDP: " + _LATER,
    "torch.distributed.optim.functional_": "TorchScript-ready functional optimizers that "
        "torch's DistributedOptimizer compiles; ringtorch's steps torch.optim's own",
    "torch.distributed.optim.named_optimizer": "FSDP's keyed optimizer: " + _LATER,
    "torch.distributed.optim.utils": "the functional-optimizer table (same reason)",
    "torch.distributed.rpc.backend_registry": "RPC backend plug-ins: ringtorch has one agent",
    "torch.distributed.rpc.internal": "torch RPC's serialization internals",
    "torch.distributed.rpc.rref_proxy": "torch RPC's internals behind RRef.rpc_sync()/remote()",
    "torch.distributed.rpc.server_process_global_profiler": "torch's profiler, which ringtorch "
                                                            "does not feed",
    "torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook": "DDP+ZeRO step overlap hooks: "
                                                                 "not provided yet",
    "torch.distributed.algorithms.ddp_comm_hooks.mixed_precision_hooks": "CUDA mixed-precision "
                                                                         "hooks",
    "torch.distributed.algorithms.ddp_comm_hooks.optimizer_overlap_hooks": "optimizer-in-"
        "backward overlap: " + _LATER,
}

# Public names of provided modules that ringtorch does not have: module -> name -> reason.
_PROCESS_CONTEXTS = "torch's process contexts; ringtorch's supervision is ringtorch._workers"
_RUN_HELPERS = "torchrun's internal helpers; ringrun's flags are parsed in ringtorch.launcher"
NAMES_LEFT_OUT: dict[str, dict[str, str]] = {
    "torch.distributed.debug": dict.fromkeys(
        ["start_debug_server", "stop_debug_server"],
        "torch's HTTP debug server over its C++ worker server; ringtorch's debug module asks "
        "a running job for its hang report instead (docs/hang-report.md)"),
    "torch.distributed.autograd": {"is_available": "the C++ build switch of torch's RPC"},
    "torch.distributed.distributed_c10d": {
        "ProcessGroupGloo": "the gloo library's class; ringtorch's 'gloo' is its own backend"},
    "torch.distributed.elastic.multiprocessing": dict.fromkeys(
        ["LogsDest", "MultiprocessContext", "PContext", "RunProcsResult", "SubprocessContext",
         "start_processes", "to_map"], _PROCESS_CONTEXTS),
    "torch.distributed.optim": {
        "as_functional_optim": "TorchScript functional optimizers (see LEFT_OUT)"},
    "torch.distributed.rpc": {
        "AllGatherStates": "torch RPC's internal shutdown state",
        "BackendValue": "RPC backend plug-ins: ringtorch has one agent",
        "init_backend": "RPC backend plug-ins (same)",
        "register_backend": "RPC backend plug-ins (same)",
        "method_factory": "torch's internal helper that generates RRef methods",
        "new_method": "torch's internal helper that generates RRef methods"},
    "torch.distributed.rpc.api": {
        "AllGatherStates": "torch RPC's internal shutdown state",
        "method_factory": "torch's internal helper that generates RRef methods",
        "new_method": "torch's internal helper that generates RRef methods"},
    "torch.distributed.run": dict.fromkeys(
        ["determine_local_world_size", "get_rdzv_endpoint", "get_use_env",
         "parse_min_max_nnodes", "run_script_path"], _RUN_HELPERS),
}

# Functions and classes whose signatures differ from torch's on purpose.
SIGNATURES_DIFFER = {
    "torch.distributed.run.config_from_args": "returns ringrun's LaunchConfig (the agent's "
                                              "input), not torch's (config, cmd, args) triple",
    "torch.distributed.run.run": "also drives the legacy launch command (use_env, "
                                 "local_rank_arg)",
    "torch.distributed.run.get_args_parser": "takes the program name, shared with "
                                             "ringtorch.distributed.launch",
    "torch.distributed.run.parse_args": "args defaults to sys.argv[1:], as argparse's",
    "torch.distributed.launch.parse_args": "args defaults to sys.argv[1:], as argparse's",
}


def _public_modules() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if not any(part.startswith("_") for part in parts[2:]):
            found.append(".".join(parts))
    return found


MODULES = _public_modules()


def _left_out(module: str) -> str | None:
    for prefix, reason in LEFT_OUT.items():
        if module == prefix or module.startswith(prefix + ".") or (
                prefix.endswith("_") and module.startswith(prefix)):
            return reason
    return None


def _ours(module: str) -> str:
    return "ringtorch" + module[len("torch"):]


def _import(name: str) -> types.ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(name)


def _provided() -> list[str]:
    return [m for m in MODULES if m != "torch.distributed" and _left_out(m) is None]


def test_the_walk_finds_torchs_module_tree() -> None:
    assert len(MODULES) > 150
    assert "torch.distributed.launcher.api" in MODULES
    assert not any("._" in m[len("torch.distributed"):] for m in MODULES)


def test_every_public_module_is_provided_or_left_out_with_a_reason() -> None:
    missing = []
    for module in MODULES:
        if _left_out(module) is not None:
            continue
        try:
            _import(_ours(module))
        except ImportError as exc:
            missing.append(f"{_ours(module)}: {exc}")
    print(f"\n{len(MODULES)} public modules under torch.distributed; "
          f"{len(_provided()) + 1} provided, {len(MODULES) - len(_provided()) - 1} left out")
    assert missing == [], "modules neither provided nor listed in LEFT_OUT:\n" + "\n".join(missing)


def test_left_out_entries_are_modules_torch_has_and_ringtorch_lacks() -> None:
    for prefix in LEFT_OUT:
        assert any(m == prefix or m.startswith(prefix) for m in MODULES), f"{prefix}: not torch's"
        if prefix in MODULES:
            with pytest.raises(ImportError):
                _import(_ours(prefix))  # provided now: take it off the list


@pytest.mark.parametrize("module", ["torch.distributed", *_provided()])
def test_a_star_import_of_each_provided_module_works(module: str) -> None:
    # ``from torch.distributed.<x> import *`` works, so ours must: __all__ holds names
    namespace: dict[str, Any] = {}
    exec(f"from {_ours(module)} import *", namespace)
    ours = _import(_ours(module))
    assert set(getattr(ours, "__all__", ())) <= set(namespace)


def _public_names(module: types.ModuleType) -> set[str]:
    if hasattr(module, "__all__"):
        return set(module.__all__)
    return {n for n, obj in vars(module).items() if not n.startswith("_")
            and not isinstance(obj, types.ModuleType)
            and getattr(obj, "__module__", None) == module.__name__}


@pytest.mark.parametrize("module", _provided())
def test_provided_module_has_torchs_public_names(module: str) -> None:
    theirs, ours = _import(module), _import(_ours(module))
    known = NAMES_LEFT_OUT.get(module, {})
    missing = sorted(n for n in _public_names(theirs) if not hasattr(ours, n) and n not in known)
    assert missing == [], f"{_ours(module)} lacks torch's {missing}"
    stale = sorted(n for n in known if hasattr(ours, n))
    assert stale == [], f"{_ours(module)} has {stale} now: take them off NAMES_LEFT_OUT"


def _params(obj: Any) -> list[tuple[str, Any, Any]] | None:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [(p.name, p.kind, _default(p.default)) for p in signature.parameters.values()
            if not p.name.startswith("_")]


def _default(value: Any) -> Any:
    """A default as compared across the two libraries: plain values as they are, members of
    an enumeration (``ReduceOp.SUM``) by name, other objects by type name."""
    name = getattr(value, "name", None)
    if isinstance(name, str) and not isinstance(value, type):
        return f"member {name}"
    if isinstance(value, (int, float, str, bool, type(None))):
        return value
    return type(value).__name__


@pytest.mark.parametrize("module", _provided())
def test_provided_functions_and_classes_take_torchs_parameters(module: str) -> None:
    theirs, ours = _import(module), _import(_ours(module))
    differ = []
    for name in sorted(_public_names(theirs)):
        mine, torchs = getattr(ours, name, None), getattr(theirs, name, None)
        if mine is None or torchs is None or f"{module}.{name}" in SIGNATURES_DIFFER:
            continue
        if not (inspect.isfunction(torchs) or inspect.isclass(torchs)):
            continue
        want, got = _params(torchs), _params(mine)
        if want is not None and got is not None and want != got:
            differ.append(f"{name}: torch {want} vs ringtorch {got}")
    assert differ == [], "\n".join(differ)


def test_importing_the_submodules_shadows_no_name_of_the_package() -> None:
    import ringtorch.distributed as rdist

    for module in _provided():
        _import(_ours(module))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        shadowed = [n for n in dir(torch.distributed) if not n.startswith("_")
                    and not isinstance(getattr(torch.distributed, n), types.ModuleType)
                    and isinstance(getattr(rdist, n, None), types.ModuleType)]
    assert shadowed == []

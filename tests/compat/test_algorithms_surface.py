"""The comm-hook, model-averaging and post-local SGD modules have torch's names and signatures.

For each module of ``torch.distributed.algorithms`` that ringtorch provides (same path with
``ringtorch``), every name of torch's ``__all__`` (or, for a module without one, every public
function and class defined in it) must exist in ringtorch's, and every function's, class
constructor's and public method's parameters must be torch's: same names, kinds and defaults.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import types

import pytest

MODULES = [
    "distributed.algorithms.ddp_comm_hooks",
    "distributed.algorithms.ddp_comm_hooks.default_hooks",
    "distributed.algorithms.ddp_comm_hooks.powerSGD_hook",
    "distributed.algorithms.ddp_comm_hooks.post_localSGD_hook",
    "distributed.algorithms.ddp_comm_hooks.quantization_hooks",
    "distributed.algorithms.ddp_comm_hooks.debugging_hooks",
    "distributed.algorithms.model_averaging.averagers",
    "distributed.algorithms.model_averaging.hierarchical_model_averager",
    "distributed.algorithms.model_averaging.utils",
    "distributed.optim.post_localSGD_optimizer",
]


def _public_names(module: types.ModuleType) -> list[str]:
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [n for n, v in vars(module).items() if not n.startswith("_")
            and (inspect.isfunction(v) or inspect.isclass(v))
            and getattr(v, "__module__", None) == module.__name__]


def _params(fn: object) -> list[tuple[str, object, object]]:
    sig = inspect.signature(fn)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def _callables(obj: object) -> dict[str, object]:
    """The object itself, or for a class its constructor and public methods."""
    if not inspect.isclass(obj):
        return {"": obj}
    found = {"__init__": obj.__init__}
    for name, value in vars(obj).items():
        if not name.startswith("_") and inspect.isfunction(value):
            found[name] = value
    return found


@pytest.mark.parametrize("path", MODULES)
def test_module_has_torchs_names_and_signatures(path: str) -> None:
    theirs = importlib.import_module(f"torch.{path}")
    ours = importlib.import_module(f"ringtorch.{path}")
    for name in _public_names(theirs):
        assert hasattr(ours, name), f"ringtorch.{path} lacks {name}"
        their_obj, our_obj = getattr(theirs, name), getattr(ours, name)
        if inspect.isclass(their_obj) and issubclass(their_obj, enum.Enum):
            assert [m.name for m in our_obj] == [m.name for m in their_obj]
            continue
        their_calls, our_calls = _callables(their_obj), _callables(our_obj)
        for member, fn in their_calls.items():
            assert member in our_calls, f"{path}.{name} lacks {member}"
            assert _params(our_calls[member]) == _params(fn), f"{path}.{name}.{member}"


def test_power_sgd_state_keeps_torchs_slots() -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as theirs

    from ringtorch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ours

    assert sorted(ours.PowerSGDState.__slots__) == sorted(theirs.PowerSGDState.__slots__)


def test_post_local_sgd_optimizer_is_exported_by_the_optim_package() -> None:
    import ringtorch.distributed.optim as optim

    assert "PostLocalSGDOptimizer" in optim.__all__

"""The layering of ARCHITECTURE.md, checked on every import statement of the package.

Each module is mapped to its layer by the longest matching prefix; each ``import`` of a
``ringtorch`` module (top level or inside a function) must point to a layer its own row
allows, and every allowance of a row must be used by some import of that layer (the table is
as tight as the code, so it documents what each layer really depends on). Layers that must
stay light (the wire, the store, rendezvous, process supervision and the launcher) may not
import torch at all. No layer reaches into another's private names: a module or name with a
leading underscore inside another layer is that layer's own business.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ringtorch"

# Modules every layer may import.
FOUNDATION = {"ringtorch", "ringtorch._config", "ringtorch._errors"}

# layer prefix -> layer prefixes it may import (besides itself and FOUNDATION).
# To add a package: add its row, allowing only the layers its modules import today (the test
# below fails on an allowance no import uses, and lists it); to let a layer import one more
# layer, add that layer to its row in the same change as the import. A new subpackage of a
# layer (say ringtorch.distributed.nn) that needs rules of its own gets a row of its own: the
# longest prefix decides a module's layer. Keep docs/architecture.md's table in step.
ALLOWED: dict[str, set[str]] = {
    "ringtorch._wire": set(),
    "ringtorch._workers": set(),
    "ringtorch._buffers": set(),
    "ringtorch._observe": set(),
    "ringtorch._device": set(),  # the device seam: torch and _config only
    "ringtorch.store": {"ringtorch._wire"},
    "ringtorch.rendezvous": {"ringtorch.store"},
    "ringtorch.collectives": {"ringtorch._wire", "ringtorch._buffers", "ringtorch._observe",
                              "ringtorch._device"},  # whether backend "nccl" is open, usable
    "ringtorch.futures": set(),
    "ringtorch.distributed": {"ringtorch.collectives", "ringtorch.rendezvous", "ringtorch.store",
                              "ringtorch._buffers", "ringtorch._observe",
                              "ringtorch._device",  # staging device tensors
                              # one world: the facade's groups in torch's c10d world, as the
                              # backend door's RingtorchGroup (distributed/_torch_world.py)
                              "ringtorch.c10d"},
    # the backend door: torch's ProcessGroup over the engine's, through torch's own store
    "ringtorch.c10d": {"ringtorch.collectives", "ringtorch.store", "ringtorch._observe"},
    "ringtorch.distributed.rpc": {"ringtorch.rendezvous", "ringtorch.store", "ringtorch._wire",
                                  "ringtorch._buffers", "ringtorch.futures",
                                  "ringtorch._observe",
                                  "ringtorch._device"},  # device maps (rpc/_devices.py)
    "ringtorch.distributed.autograd": {"ringtorch.distributed.rpc", "ringtorch.futures"},
    # the public names of ringtorch.distributed (functional), of rpc (RemoteModule)
    "ringtorch.distributed.nn": {"ringtorch.distributed", "ringtorch.distributed.rpc",
                                 "ringtorch.futures"},
    "ringtorch.distributed.optim": {"ringtorch.distributed.autograd",
                                    "ringtorch.distributed.rpc",
                                    # ZeroRedundancyOptimizer, PostLocalSGDOptimizer: the
                                    # facade's public names, Join, the averagers
                                    "ringtorch.distributed", "ringtorch.distributed.algorithms"},
    # the facade's public names (ringtorch.distributed) and futures; not rpc, autograd, nn
    "ringtorch.distributed.algorithms": {"ringtorch.distributed", "ringtorch.futures"},
    # torch's modern stack under ringtorch's paths (docs/modern-stack.md): torch's modules and
    # the re-export rule only, never the engine (their groups come through the backend door)
    "ringtorch.distributed._torch_names": set(),
    **dict.fromkeys(["ringtorch.distributed.device_mesh", "ringtorch.distributed.tensor",
                     "ringtorch.distributed._tensor", "ringtorch.distributed.fsdp",
                     "ringtorch.distributed.checkpoint", "ringtorch.distributed.pipelining",
                     "ringtorch.distributed._functional_collectives"],
                    {"ringtorch.distributed._torch_names"}),
    "ringtorch.distributed.run": {"ringtorch.launcher"},
    "ringtorch.distributed.launch": {"ringtorch.launcher"},
    "ringtorch.distributed.elastic": {"ringtorch._workers", "ringtorch.launcher",
                                      "ringtorch.store", "ringtorch._wire"},
    # elastic's data helpers: samplers are torch's (torch allowed), DistributedSampler ours
    "ringtorch.distributed.elastic.utils.data": {"ringtorch.utils"},
    "ringtorch.distributed.argparse_util": {"ringtorch.launcher"},
    "ringtorch.distributed.launcher": {"ringtorch.launcher", "ringtorch._workers",
                                       "ringtorch.distributed.elastic"},
    "ringtorch.launcher": {"ringtorch.store", "ringtorch._workers", "ringtorch._wire",
                           "ringtorch._observe"},
    "ringtorch.multiprocessing": {"ringtorch._workers"},
    # _device.place: DDP and DataParallel on modules in device memory
    "ringtorch.nn": {"ringtorch.distributed", "ringtorch._device"},
    "ringtorch.utils": {"ringtorch.distributed"},
    "ringtorch.testing": {"ringtorch"},  # anything public
}

NO_TORCH = ("ringtorch._wire", "ringtorch._observe", "ringtorch._workers", "ringtorch.store",
            "ringtorch.rendezvous",
            "ringtorch.launcher", "ringtorch.distributed.run", "ringtorch.distributed.launch",
            "ringtorch.distributed.launcher", "ringtorch.distributed.elastic")

# (importing module, private name of another layer it reads) pairs still tolerated, each with
# its reason. The test fails on a new private reach-in AND on a pair here that the code no
# longer makes, so the list only shrinks: delete a pair when its code is fixed.
PRIVATE_READS_ALLOWED: dict[tuple[str, str], str] = {
    ("ringtorch.distributed.nn.api.remote_module",
     "ringtorch.distributed.remote_device._remote_device"):
        "torch's own (underscored) class name at torch's path, which RemoteModule uses as "
        "torch's does",
}


@dataclass(frozen=True)
class Import:
    """One imported module or name: ``module`` is the module named by the statement,
    ``name`` the name taken from it (``from module import name``) or None (``import module``),
    ``bound`` the local name the statement binds."""

    lineno: int
    module: str
    name: str | None
    bound: str
    in_function: bool
    type_only: bool  # under ``if TYPE_CHECKING:``


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer_of(module: str) -> str | None:
    best = None
    for prefix in ALLOWED:
        if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > len(best)):
            best = prefix
    return best


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _nodes_under(tree: ast.AST, kinds: tuple[type, ...], test: str | None = None) -> set[int]:
    """ids of the nodes inside a node of ``kinds`` (for ast.If: only if its test mentions
    ``test``)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, kinds) and (test is None or test in ast.unparse(node.test)):
            inside.update(id(sub) for sub in ast.walk(node) if sub is not node)
    return inside


def import_records(path: Path, package: Path = PACKAGE) -> list[Import]:
    """Every import statement of the file, wherever it sits, resolved to absolute names."""
    tree = _parse(path)
    module = _module_name(path, package)
    in_function = _nodes_under(tree, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
    type_only = _nodes_under(tree, (ast.If,), "TYPE_CHECKING")
    found = []
    for node in ast.walk(tree):
        where = dict(lineno=getattr(node, "lineno", 0), in_function=id(node) in in_function,
                     type_only=id(node) in type_only)
        if isinstance(node, ast.Import):
            found.extend(Import(module=alias.name, name=None,
                                bound=alias.asname or alias.name.split(".")[0], **where)
                         for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if path.name != "__init__.py":
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.extend(Import(module=target, name=alias.name, bound=alias.asname or alias.name,
                                **where) for alias in node.names)
    return found


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every module an import statement names."""
    found = []
    for record in import_records(path):
        found.append((record.lineno, record.module))
        # `from ringtorch import distributed` imports a subpackage: check it too.
        if record.name is not None and record.module == "ringtorch":
            found.append((record.lineno, f"ringtorch.{record.name}"))
    return sorted(set(found))


def _package_files(package: Path = PACKAGE) -> list[Path]:
    return sorted(package.rglob("*.py"))


def _cross_layer_imports() -> list[tuple[str, str, str, str]]:
    """(where, importing module, its layer, imported module) for every ringtorch import."""
    found = []
    for path in _package_files():
        module = _module_name(path)
        for lineno, target in _imports(path):
            found.append((f"{path.relative_to(PACKAGE.parent)}:{lineno}", module,
                          _layer_of(module), target))
    return found


def _violations() -> list[str]:
    problems = []
    for where, module, layer, target in _cross_layer_imports():
        if target.split(".")[0] == "torch" and layer in NO_TORCH:
            problems.append(f"{where}: {module} imports torch, which layer {layer} must not")
        if not target.startswith("ringtorch") or target in FOUNDATION:
            continue
        if target == "ringtorch.testing" or target.startswith("ringtorch.testing."):
            if layer != "ringtorch.testing":
                problems.append(f"{where}: {module} imports {target}; nothing under "
                                f"ringtorch/ may import ringtorch.testing")
            continue
        if layer is None:
            problems.append(f"{where}: {module} is in no layer of the table")
            continue
        if _allowance_for(layer, target) is None:
            problems.append(f"{where}: {module} (layer {layer}) imports {target} "
                            f"(layer {_layer_of(target)}), which its row does not allow")
    return problems


def _allowance_for(layer: str, target: str) -> str | None:
    """The entry of ``layer``'s row (or the layer itself) that lets it import ``target``."""
    target_layer = _layer_of(target)
    if target_layer is None:
        return None
    for allowed in sorted(ALLOWED[layer] | {layer}, key=len, reverse=True):
        if target_layer == allowed or target_layer.startswith(allowed + "."):
            return allowed
    return None


def test_every_import_points_down_the_layers() -> None:
    problems = _violations()
    assert not problems, "layering violations:\n" + "\n".join(problems)


def test_every_allowance_is_used() -> None:
    used: set[tuple[str, str]] = set()
    for _, _, layer, target in _cross_layer_imports():
        if layer is not None and target.startswith("ringtorch") and target not in FOUNDATION:
            allowance = _allowance_for(layer, target)
            if allowance is not None:
                used.add((layer, allowance))
    unused = [f"{layer} -> {allowed}" for layer, row in ALLOWED.items() for allowed in sorted(row)
              if (layer, allowed) not in used]
    assert not unused, ("allowances of the layer table that no import uses (remove them from "
                        "ALLOWED and from docs/architecture.md):\n" + "\n".join(unused))


def _private_part(dotted: str, importer_layer: str | None) -> str | None:
    """``dotted`` cut after its first private part inside a layer other than the importer's,
    or None when it names nothing private of another layer. The underscore-named layers
    (``_config``, ``_wire``...) are layers in their own right: importing them is allowed by
    the table; only underscore names inside them are private."""
    if not dotted.startswith("ringtorch.") or dotted in FOUNDATION:
        return None
    layer = _layer_of(dotted)
    if layer is None or layer == importer_layer:
        return None
    parts = dotted.split(".")
    for i in range(len(layer.split(".")), len(parts)):
        if parts[i].startswith("_") and not parts[i].startswith("__"):
            return ".".join(parts[: i + 1])
    return None


def _bound_to(record: Import) -> str:
    """What the name an import binds refers to: ``import a.b`` binds ``a``; ``import a.b as
    c`` binds ``a.b``; ``from a import b`` binds ``a.b``."""
    if record.name is not None:
        return f"{record.module}.{record.name}"
    top = record.module.split(".")[0]
    return top if record.bound == top else record.module


def _private_reads(package: Path = PACKAGE) -> dict[tuple[str, str], list[str]]:
    """(importing module, private name) -> where: every import of another layer's private
    module or name, and every attribute read of one through a name an import bound (as
    ``from ringtorch.distributed.rpc import agent`` then ``agent._current``). What it cannot
    see: private members reached through objects (``group._backend``), which need types."""
    found: dict[tuple[str, str], list[str]] = {}

    def note(module: str, hit: str | None, where: str) -> None:
        if hit is not None and where not in found.setdefault((module, hit), []):
            found[(module, hit)].append(where)

    for path in _package_files(package):
        module = _module_name(path, package)
        layer = _layer_of(module)
        rel = path.relative_to(package.parent)
        bound = {}
        for record in import_records(path, package):
            bound[record.bound] = _bound_to(record)
            dotted = record.module if record.name is None else f"{record.module}.{record.name}"
            note(module, _private_part(dotted, layer), f"{rel}:{record.lineno}")
        for node in ast.walk(_parse(path)):
            if not isinstance(node, ast.Attribute):
                continue
            chain, base = [], node
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                dotted = ".".join([bound[base.id], *reversed(chain)])
                note(module, _private_part(dotted, layer), f"{rel}:{node.lineno}")
    return {key: where for key, where in found.items() if where}


def test_no_layer_reads_another_layers_private_names() -> None:
    found = _private_reads()
    new = [f"{', '.join(where)}: {module} reads {name}" for (module, name), where in
           sorted(found.items()) if (module, name) not in PRIVATE_READS_ALLOWED]
    stale = [f"{module} -> {name}" for module, name in PRIVATE_READS_ALLOWED
             if (module, name) not in found]
    message = []
    if new:
        message += ["private names read across layers (make the name public in its layer, or "
                    "go through its public API):", *new]
    if stale:
        message += ["PRIVATE_READS_ALLOWED lists reads the code no longer makes (delete them):",
                    *stale]
    assert not message, "\n".join(message)


def test_the_private_name_check_sees_imports_and_attribute_reads(tmp_path: Path) -> None:
    """The check finds what it claims to find, on a small package written for the purpose."""
    pkg = tmp_path / "ringtorch"
    files = {
        "nn/a.py": "from ringtorch.distributed._world import group\n",
        "nn/b.py": "def f():\n    from ringtorch.distributed.ops import _flatten\n",
        "nn/c.py": "from ringtorch.distributed.rpc import agent\nx = agent._current.y\n",
        "nn/d.py": "import ringtorch.futures\nringtorch.futures._hooks.append(1)\n",
        "nn/ok.py": ("import ringtorch._config\nfrom ringtorch import _buffers\n"
                     "from ringtorch._wire.mesh import PeerMesh\n"
                     "from ringtorch.distributed import all_reduce\nall_reduce.__name__\n"),
        "distributed/own.py": "from ringtorch.distributed._world import group\n",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    found = _private_reads(pkg)
    assert found == {
        ("ringtorch.nn.a", "ringtorch.distributed._world"): ["ringtorch/nn/a.py:1"],
        ("ringtorch.nn.b", "ringtorch.distributed.ops._flatten"): ["ringtorch/nn/b.py:2"],
        ("ringtorch.nn.c", "ringtorch.distributed.rpc.agent._current"): ["ringtorch/nn/c.py:2"],
        ("ringtorch.nn.d", "ringtorch.futures._hooks"): ["ringtorch/nn/d.py:2"],
    }


def test_facade_does_not_import_rpc_autograd_or_optim() -> None:
    init = PACKAGE / "distributed" / "__init__.py"
    if not init.exists():
        pytest.fail("ringtorch/distributed/__init__.py is missing")
    targets = [t for _, t in _imports(init)]
    bad = [t for t in targets if t.startswith(("ringtorch.distributed.rpc",
                                               "ringtorch.distributed.autograd",
                                               "ringtorch.distributed.optim"))]
    assert not bad, f"ringtorch.distributed must not import {bad} (as in torch)"


def test_importing_ringtorch_imports_nothing_heavy() -> None:
    import subprocess
    import sys

    code = ("import sys, ringtorch; print(sorted(m for m in sys.modules "
            "if m.startswith(('torch', 'numpy', 'ringtorch.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

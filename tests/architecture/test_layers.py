"""The layering of ARCHITECTURE.md, checked on every import statement of the package.

Each module is mapped to its layer by the longest matching prefix; each ``import`` of a
``ringtorch`` module (top level or inside a function) must point to a layer its own row
allows. Layers that must stay light (the wire, the store, rendezvous, process supervision and
the launcher) may not import torch at all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "ringtorch"

# Modules every layer may import.
FOUNDATION = {"ringtorch", "ringtorch._config", "ringtorch._errors"}

# layer prefix -> layer prefixes it may import (besides itself and FOUNDATION).
ALLOWED: dict[str, set[str]] = {
    "ringtorch._wire": set(),
    "ringtorch._workers": set(),
    "ringtorch._buffers": set(),
    "ringtorch.store": {"ringtorch._wire"},
    "ringtorch.rendezvous": {"ringtorch.store", "ringtorch._wire"},
    "ringtorch.collectives": {"ringtorch.rendezvous", "ringtorch.store", "ringtorch._wire",
                              "ringtorch._buffers"},
    "ringtorch.futures": set(),
    "ringtorch.distributed": {"ringtorch.collectives", "ringtorch.rendezvous", "ringtorch.store",
                              "ringtorch._buffers", "ringtorch._wire"},
    "ringtorch.distributed.rpc": {"ringtorch.rendezvous", "ringtorch.store", "ringtorch._wire",
                                  "ringtorch._buffers", "ringtorch.futures"},
    "ringtorch.distributed.autograd": {"ringtorch.distributed.rpc", "ringtorch.futures",
                                       "ringtorch._buffers"},
    "ringtorch.distributed.optim": {"ringtorch.distributed.autograd",
                                    "ringtorch.distributed.rpc", "ringtorch.futures"},
    "ringtorch.distributed.run": {"ringtorch.launcher", "ringtorch._workers",
                                  "ringtorch.rendezvous", "ringtorch.store"},
    "ringtorch.distributed.launch": {"ringtorch.distributed.run", "ringtorch.launcher",
                                     "ringtorch._workers"},
    "ringtorch.distributed.elastic": {"ringtorch._workers", "ringtorch.launcher",
                                      "ringtorch.store", "ringtorch._wire"},
    "ringtorch.distributed.argparse_util": {"ringtorch.launcher"},
    "ringtorch.distributed.launcher": {"ringtorch.launcher", "ringtorch._workers",
                                       "ringtorch.distributed.elastic"},
    "ringtorch.launcher": {"ringtorch.rendezvous", "ringtorch.store", "ringtorch._workers",
                           "ringtorch._wire"},
    "ringtorch.multiprocessing": {"ringtorch._workers"},
    "ringtorch.nn": {"ringtorch.distributed"},
    "ringtorch.utils": {"ringtorch.distributed"},
    "ringtorch.testing": {"ringtorch"},  # anything public
}

NO_TORCH = ("ringtorch._wire", "ringtorch._workers", "ringtorch.store", "ringtorch.rendezvous",
            "ringtorch.launcher", "ringtorch.distributed.run", "ringtorch.distributed.launch",
            "ringtorch.distributed.launcher", "ringtorch.distributed.elastic")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
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


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    module = _module_name(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if path.name != "__init__.py":
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            # `from ringtorch import distributed` imports a subpackage: check it too.
            found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names
                         if target == "ringtorch")
    return found


def _violations() -> list[str]:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        layer = _layer_of(module)
        for lineno, target in _imports(path):
            where = f"{path.relative_to(PACKAGE.parent)}:{lineno}"
            if target.split(".")[0] == "torch" and layer is not None and layer.startswith(NO_TORCH):
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
            target_layer = _layer_of(target)
            allowed = ALLOWED[layer] | {layer}
            if target_layer is None or not any(
                    target_layer == a or target_layer.startswith(a + ".") for a in allowed):
                problems.append(f"{where}: {module} (layer {layer}) imports {target} "
                                f"(layer {target_layer}), which its row does not allow")
    return problems


def test_every_import_points_down_the_layers() -> None:
    problems = _violations()
    assert not problems, "layering violations:\n" + "\n".join(problems)


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

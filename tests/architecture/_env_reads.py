"""Every environment variable ringtorch/ reads, found by walking each module's syntax tree.

A read is ``os.environ[K]``, ``os.environ.get(K)`` (also ``setdefault``, ``pop``),
``os.getenv(K)`` and ``K in os.environ``, on ``os.environ`` or on a mapping named ``environ``
(the rendezvous and the launcher pass the environment around under that name). The key ``K``
is resolved as far as the source allows: a string; an f-string (``f"PET_{dest}"`` reads
``PET_*``); a module-level constant, here or imported from another ringtorch module (every
string in it, for a table of names); a loop variable over such a constant; a local assigned
once; or a parameter of the enclosing function, through every call of that function in the
package. A read whose key cannot be resolved is reported as such, so that a new one is seen.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ringtorch"
_GETTERS = {"get", "setdefault", "pop"}


@dataclass
class Read:
    """One environment read: where, and the variable names its key can take (None: unknown)."""

    module: str
    function: str
    line: int
    names: frozenset[str] | None


@dataclass
class _Module:
    name: str
    tree: ast.Module
    constants: dict[str, ast.expr] = field(default_factory=dict)
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)  # alias: (module, name)
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)


def _load(path: Path) -> _Module:
    name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    name = name.removesuffix(".__init__")
    module = _Module(name, ast.parse(path.read_text(), str(path)))
    for node in module.tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            module.constants[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            module.constants[node.target.id] = node.value
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                module.imported[alias.asname or alias.name] = (node.module, alias.name)
    for parent in ast.walk(module.tree):
        for child in ast.iter_child_nodes(parent):
            module.parents[child] = parent
    return module


class _Package:
    """The parsed package and what resolving a key needs: constants, imports, call sites."""

    def __init__(self) -> None:
        self.modules = {m.name: m for m in map(_load, sorted(PACKAGE.rglob("*.py")))}
        # function name -> every call of a function of that name: (module, call node)
        self.calls: dict[str, list[tuple[_Module, ast.Call]]] = {}
        for module in self.modules.values():
            for node in ast.walk(module.tree):
                if isinstance(node, ast.Call):
                    callee = node.func
                    name = callee.id if isinstance(callee, ast.Name) else (
                        callee.attr if isinstance(callee, ast.Attribute) else None)
                    if name:
                        self.calls.setdefault(name, []).append((module, node))

    def reads(self) -> Iterator[Read]:
        for module in self.modules.values():
            for node in ast.walk(module.tree):
                key = _key_of_read(node)
                if key is not None:
                    function = self._function(module, node)
                    names = self.resolve(module, key, 3)
                    yield Read(module.name, function.name if function else "<module>",
                               node.lineno, None if names is None else frozenset(names))

    def _function(self, module: _Module, node: ast.AST) -> ast.FunctionDef | None:
        while node in module.parents:
            node = module.parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return node  # type: ignore[return-value]
        return None

    def _constant(self, module: _Module, name: str, depth: int) -> set[str] | None:
        if name in module.constants:
            return _strings(module.constants[name])
        if name in module.imported and depth > 0:
            source, original = module.imported[name]
            if source in self.modules:
                return self._constant(self.modules[source], original, depth - 1)
        return None

    def resolve(self, module: _Module, key: ast.expr, depth: int) -> set[str] | None:
        """The names ``key`` (an expression in ``module``) can take; None when unknown."""
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return {key.value}
        if isinstance(key, ast.JoinedStr):
            return {"".join(v.value if isinstance(v, ast.Constant) else "*" for v in key.values)}
        if isinstance(key, ast.Subscript):  # an entry of a table: any name in the table
            return self.resolve(module, key.value, depth)
        if not isinstance(key, ast.Name) or depth < 0:
            return None
        function = self._function(module, key)
        if function is not None:
            local = self._resolve_local(module, function, key.id, depth)
            if local is not None:
                return local
        return self._constant(module, key.id, 2)

    def _resolve_local(self, module: _Module, function: ast.FunctionDef, name: str,
                       depth: int) -> set[str] | None:
        for node in ast.walk(function):
            if isinstance(node, ast.For) and name in _target_names(node.target):
                return self.resolve(module, node.iter, depth)
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return self.resolve(module, node.value, depth)
        params = [a.arg for a in (*function.args.posonlyargs, *function.args.args)]
        if name in params or name in [a.arg for a in function.args.kwonlyargs]:
            return self._through_callers(function, name, params, depth)
        return None

    def _through_callers(self, function: ast.FunctionDef, name: str, params: list[str],
                         depth: int) -> set[str] | None:
        found: set[str] = set()
        index = params.index(name) if name in params else -1
        if params[:1] in (["self"], ["cls"]):
            index -= 1  # a method's callers do not pass self
        for module, call in self.calls.get(function.name, []):
            args = [k.value for k in call.keywords if k.arg == name]
            if not args and 0 <= index < len(call.args):
                args = [call.args[index]]
            for arg in args:
                names = self.resolve(module, arg, depth - 1)
                if names is None:
                    return None
                found |= names
        return found or None


def _strings(value: ast.expr) -> set[str] | None:
    found = {n.value for n in ast.walk(value)
             if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    return found or None


def _target_names(target: ast.expr) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _is_environ(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "environ" and isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and node.id == "environ"


def _key_of_read(node: ast.AST) -> ast.expr | None:
    """The key expression when ``node`` reads the environment, else None."""
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _GETTERS and _is_environ(func.value):
            return node.args[0]
        if (isinstance(func, ast.Attribute) and func.attr == "getenv"
                and isinstance(func.value, ast.Name) and func.value.id == "os"):
            return node.args[0]
        if isinstance(func, ast.Name) and func.id == "getenv":
            return node.args[0]
    if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load)
            and _is_environ(node.value)):
        return node.slice
    if (isinstance(node, ast.Compare) and len(node.ops) == 1
            and isinstance(node.ops[0], ast.In | ast.NotIn) and _is_environ(node.comparators[0])):
        return node.left
    return None


@functools.cache
def environment_reads() -> tuple[Read, ...]:
    """Every environment read in ringtorch/, in module order (walked once per test run)."""
    return tuple(_Package().reads())

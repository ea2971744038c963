"""Which names of one of torch's modules its ringtorch path re-exports.

The modern-stack paths (device_mesh, tensor, fsdp, checkpoint, pipelining, ...) are torch's
own code reached under ringtorch's name; each takes its names from here, so every path follows
one rule: torch's ``__all__`` where the module has one, otherwise its public names that are
neither modules nor helpers it imported from outside ``torch.distributed``.
"""

from __future__ import annotations

import types


def public_names(module: types.ModuleType) -> list[str]:
    """The names of ``module`` that are its API, in sorted order."""
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return sorted(declared)
    names = []
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType):
            continue
        # typing helpers, pytree utilities and constants torch imported are not its API
        if str(getattr(value, "__module__", "")).startswith("torch.distributed"):
            names.append(name)
    return sorted(names)


def reexport(module: types.ModuleType, namespace: dict[str, object]) -> list[str]:
    """Bind ``module``'s public names in ``namespace`` (a module's globals); returns them."""
    names = public_names(module)
    namespace.update({name: getattr(module, name) for name in names})
    return names

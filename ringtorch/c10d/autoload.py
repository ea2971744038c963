"""The entry point torch's backend autoload runs at the end of ``import torch``.

pyproject.toml declares ``register`` in the ``torch.backends`` entry-point group; torch calls
it once ``torch.distributed`` is imported (``torch/__init__.py`` imports it before running
the autoload), and ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns it off. The rule this module
keeps: registering is cheap. It only names the backend; no ringtorch engine module is
imported and no thread started until a program creates a "ringtorch" group.
"""

from __future__ import annotations

from typing import Any


def _create(backend_opts: Any, pg_options: Any = None) -> Any:
    """torch's creator for backend "ringtorch": imports the engine on first use."""
    from ringtorch.c10d.group import create

    return create(backend_opts, pg_options)


def register() -> None:
    """Register backend "ringtorch" (CPU tensors) with torch.distributed; idempotent."""
    import torch.distributed as dist

    if not dist.is_available() or "RINGTORCH" in dist.Backend._plugins:
        return
    dist.Backend.register_backend("ringtorch", _create, extended_api=True, devices=["cpu"])


__all__ = ["register"]

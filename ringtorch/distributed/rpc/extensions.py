"""RPC's extension registry: request handlers, and the packages above RPC, loaded on first use.

A request kind maps to a ``Handler`` (``register_handler``). A package above RPC registers
itself as an ``Extension`` by name: the request kinds it serves and, for at most one, the
autograd context ids of the message header. Nothing has to be imported in advance: the first
request of one of its kinds, the first message that carries a context id, or the first call
that asks for it (``attach``) imports the package and attaches it to the agent. So a worker
that never imported ``ringtorch.distributed.autograd`` still records and runs its part of a
distributed backward, as in torch.

Distributed autograd is registered here, by module name (rpc/ may not import the layer above
it; importing by name on first use is how optional plug-ins load, as the collective backends
do). The rule kept: one handler per kind, one extension per kind range, and one extension
owns the context ids.
"""

from __future__ import annotations

import importlib
from typing import Any

from ringtorch.distributed.rpc._interfaces import (
    Agent,
    AutogradHook,
    Extension,
    Handler,
    RunningAgent,
)
from ringtorch.distributed.rpc._state import STATE, current_agent
from ringtorch.distributed.rpc._workerinfo import WorkerInfo
from ringtorch.distributed.rpc.messages import RESPONSE


def register_handler(handler: Handler) -> None:
    """Register the handler of a request kind.

    Raises:
        ValueError: the kind is a response kind or already has another handler.
    """
    if handler.kind >= RESPONSE or handler.kind <= 0:
        raise ValueError(f"request kinds are 1..{RESPONSE - 1}, got {handler.kind}")
    known = STATE.handlers.get(handler.kind)
    if known is not None and known is not handler:
        raise ValueError(f"RPC message kind {handler.kind} already has a handler")
    STATE.handlers[handler.kind] = handler


def register_extension(extension: Extension) -> None:
    """Register a package that plugs into the agent (see ``Extension``).

    Raises:
        ValueError: another extension has that name, serves one of its kinds, or already
            owns the context ids; ``attach`` is not of the form ``"module:function"``.
    """
    if ":" not in extension.attach:
        raise ValueError(f"Extension.attach must be 'module:function', got "
                         f"{extension.attach!r}")
    for other in STATE.extensions.values():
        if other == extension:
            return
        clash = (other.name == extension.name or set(other.kinds) & set(extension.kinds)
                 or (other.context_ids and extension.context_ids))
        if clash:
            raise ValueError(f"RPC extension {extension.name!r} clashes with the registered "
                             f"extension {other.name!r} (same name, kinds or context ids)")
    STATE.extensions[extension.name] = extension


def handler(kind: int) -> Handler | None:
    """The handler of ``kind``, importing the extension that serves it if need be."""
    found = STATE.handlers.get(kind)
    if found is not None:
        return found
    for extension in list(STATE.extensions.values()):
        if kind in extension.kinds:
            _import(extension)
    return STATE.handlers.get(kind)


def attach(agent: Agent, name: str) -> Any:
    """Import extension ``name`` and return what its attach function makes for ``agent``
    (the agent calls this once and keeps the result).

    Raises:
        KeyError: no extension has that name.
    """
    extension = STATE.extensions[name]
    return _import(extension)(agent)


def attach_context_hook(agent: Agent) -> AutogradHook:
    """Attach the extension that owns the header's context ids (distributed autograd).

    Raises:
        RuntimeError: no registered extension owns them.
    """
    for extension in list(STATE.extensions.values()):
        if extension.context_ids:
            hook: AutogradHook = attach(agent, extension.name)
            return hook
    raise RuntimeError("an RPC message carries a distributed autograd context, and no RPC "
                       "extension handles context ids")


def _import(extension: Extension) -> Any:
    module_name, _, function = extension.attach.partition(":")
    module = importlib.import_module(module_name)  # concurrent first imports wait for one
    return getattr(module, function)


register_extension(Extension("distributed autograd", "ringtorch.distributed.autograd.engine:attach",
                             kinds=range(32, 64), context_ids=True))

__all__ = [
    "Agent",
    "AutogradHook",
    "Extension",
    "Handler",
    "RunningAgent",
    "WorkerInfo",
    "attach",
    "attach_context_hook",
    "current_agent",
    "handler",
    "register_extension",
    "register_handler",
]

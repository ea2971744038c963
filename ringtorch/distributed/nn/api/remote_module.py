"""``RemoteModule``: an ``nn.Module`` that lives on another RPC worker, as torch's.

The module is built on its worker by ``rpc.remote`` and held there by an RRef; ``forward``
runs it there with one RPC, so inside a distributed autograd context the call is recorded and
the backward reaches the remote parameters. The local object holds only the RRef and where it
points (``on``, ``device``): that is what travels when a RemoteModule is sent over RPC, so every
copy drives the same module. Methods that would need the module's state here (``parameters``,
``to``, hooks, ...) raise torch's ``ValueError``; ``remote_parameters`` gives RRefs to the
parameters instead, for ``DistributedOptimizer``.

Only CPU devices are accepted: ringtorch's RPC agent moves CPU tensors, so a module on a CUDA
device could neither receive its inputs nor return its outputs. TorchScript RemoteModules
(torch's private ``_module_interface_cls``) are not provided.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NoReturn

from torch import nn

import ringtorch.distributed.rpc as rpc
from ringtorch.distributed.remote_device import _remote_device
from ringtorch.futures import Future

__all__ = ["RemoteModule"]

# What a RemoteModule is, and what travels when it is sent over RPC.
_PICKLED_ATTRIBUTES = ("on", "device", "is_device_map_set", "is_scriptable", "module_rref")

# Methods of nn.Module that would act on a local copy of the module's state, which a
# RemoteModule does not have (torch's list).
_NOT_SUPPORTED = (
    "register_buffer", "register_parameter", "add_module", "apply", "cuda", "ipu", "xpu", "cpu",
    "type", "float", "double", "half", "bfloat16", "to", "register_backward_hook",
    "register_forward_pre_hook", "register_forward_hook", "state_dict", "load_state_dict",
    "named_parameters", "buffers", "named_buffers", "children", "named_children", "modules",
    "named_modules", "requires_grad_", "zero_grad", "share_memory", "extra_repr",
)


def _raise_not_supported(name: str) -> NoReturn:
    raise ValueError(f"Method ``{name}`` not supported for RemoteModule")


# ---- run on the module's worker --------------------------------------------------------------


def _create_module(module_cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                   device: str) -> nn.Module:
    module = module_cls(*args, **kwargs)
    if not isinstance(module, nn.Module):
        raise ValueError(
            "Expect `module_cls(*args, **kwargs)` returns an instance of <class nn.Module>, "
            f"but it returns an instance of {type(module)}.")
    return module.to(device)


def _remote_forward(module_rref: rpc.RRef[nn.Module], device: str, is_device_map_set: bool,
                    *args: Any, **kwargs: Any) -> Any:
    return module_rref.local_value().forward(*args, **kwargs)


def _param_rrefs(module_rref: rpc.RRef[nn.Module], recurse: bool) -> list[rpc.RRef[Any]]:
    return [rpc.RRef(param) for param in module_rref.local_value().parameters(recurse)]


def _set_training(module_rref: rpc.RRef[nn.Module], mode: bool) -> None:
    module_rref.local_value().train(mode)


class RemoteModule(nn.Module):
    """A module created on the worker ``remote_device`` names; ``forward`` runs it there.

    Args:
        remote_device: ``"<worker name>/<device>"`` or ``"rank:<rank>/<device>"``, the device
            part optional (``"ps"`` means ``"ps/cpu"``); the device must be a CPU.
        module_cls: the module's class (or any callable returning an ``nn.Module``), called
            on that worker as ``module_cls(*args, **kwargs)``.
        args, kwargs: its arguments (sent over RPC, so picklable).

    Raises:
        AssertionError: RPC is not initialized (torch's type and message).
        ValueError: ``remote_device`` cannot be parsed (torch's message), names no worker, or
            names a device other than a CPU.
        RuntimeError: no worker has that name or rank.

    Example (on worker0, with a worker named ``worker1`` in the RPC group)::

        remote_linear = RemoteModule("worker1/cpu", nn.Linear, args=(20, 30))
        out = remote_linear.forward(torch.randn(128, 20))       # runs on worker1
        fut = remote_linear.forward_async(torch.randn(128, 20))  # a Future of the same
    """

    def __init__(self, remote_device: str, module_cls: type[nn.Module],
                 args: tuple[Any, ...] | None = None,
                 kwargs: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._prepare_init(remote_device)
        self.is_scriptable = False
        self.module_rref = rpc.remote(
            self.on, _create_module,
            (module_cls, tuple(args) if args is not None else (), dict(kwargs or {}),
             self.device))

    def _prepare_init(self, remote_device: str) -> None:
        try:
            rpc.get_worker_info()
        except RuntimeError:
            raise AssertionError("RemoteModule only works in RPC.") from None
        where = _remote_device(remote_device)
        if where.device().type != "cpu":
            raise ValueError(
                f"RemoteModule cannot place a module on {where.device()} ({remote_device!r}): "
                f"ringtorch's RPC moves CPU tensors only; use '<worker>/cpu'")
        if where.worker_name() is None and where.rank() is None:
            raise ValueError(f"RemoteModule needs a worker in remote_device: "
                             f"'<worker>/cpu' or 'rank:<rank>/cpu', got {remote_device!r}")
        self.on: str | int = (where.worker_name() if where.worker_name() is not None
                              else where.rank())  # type: ignore[assignment]
        rpc.get_worker_info(self.on)  # an unknown worker fails here, not at the first call
        self.device = str(where.device())
        self.is_device_map_set = False  # CPU only: no device map applies

    # ---- what a RemoteModule does -------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the module's ``forward`` on its worker and return the result (blocking)."""
        return self.forward_async(*args, **kwargs).wait()

    def forward_async(self, *args: Any, **kwargs: Any) -> Future[Any]:
        """As ``forward``, returning at once a Future of the result."""
        return rpc.rpc_async(self.module_rref.owner(), _remote_forward,
                             (self.module_rref, self.device, self.is_device_map_set, *args),
                             kwargs)

    def remote_parameters(self, recurse: bool = True) -> list[rpc.RRef[nn.Parameter]]:
        """RRefs to the module's parameters (to its direct ones only without ``recurse``), in
        ``parameters()`` order: what ``DistributedOptimizer`` takes."""
        return rpc.rpc_sync(self.on, _param_rrefs, args=(self.module_rref, recurse))

    def get_module_rref(self) -> rpc.RRef[nn.Module]:
        """The RRef to the module on its worker."""
        return self.module_rref

    def train(self, mode: bool = True) -> RemoteModule:
        """Set the remote module's training mode (torch calls ``train()`` there whatever
        ``mode`` says; here ``mode`` is honoured). Returns this RemoteModule."""
        rpc.rpc_sync(self.on, _set_training, args=(self.module_rref, mode))
        self.training = mode
        return self

    def eval(self) -> RemoteModule:
        """``train(False)``."""
        return self.train(False)

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]:
        """Not supported: the parameters are on the module's worker (``remote_parameters``)."""
        raise ValueError("Method ``parameters`` not supported for RemoteModule. Please use "
                         "``remote_parameters`` instead.")

    # ---- travelling over RPC ------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """What travels: where the module is and its RRef. Only the RPC framework can pickle
        the RRef, so pickling a RemoteModule anywhere else fails."""
        return {name: self.__dict__[name] for name in _PICKLED_ATTRIBUTES}

    def __setstate__(self, state: dict[str, Any]) -> None:
        nn.Module.__init__(self)
        self.__dict__.update(state)

    @staticmethod
    def init_from_module_rref(remote_device: str, module_rref: rpc.RRef[nn.Module],
                              _module_interface_cls: Any = None) -> RemoteModule:
        """A RemoteModule driving the module ``module_rref`` already points to (several
        RemoteModules may share one module).

        Raises:
            ValueError: ``_module_interface_cls`` is given (TorchScript RemoteModules are not
                provided), or as the constructor for ``remote_device``.
        """
        if _module_interface_cls is not None:
            raise ValueError("TorchScript RemoteModules (_module_interface_cls) are not "
                             "supported by ringtorch")
        module = RemoteModule.__new__(RemoteModule)
        nn.Module.__init__(module)
        module._prepare_init(remote_device)
        module.is_scriptable = False
        module.module_rref = module_rref
        return module


def _not_supported_method(name: str) -> Any:
    def method(self: RemoteModule, *args: Any, **kwargs: Any) -> NoReturn:
        _raise_not_supported(name)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = "Not supported for a RemoteModule (raises ValueError, as torch)."
    return method


for _name in _NOT_SUPPORTED:
    setattr(RemoteModule, _name, _not_supported_method(_name))
del _name

"""DataParallel: one process, the batch split over several replicas of a module run in threads.

torch's ``nn.DataParallel`` with its helpers (scatter, replicate, parallel_apply, gather), same
names and semantics: each forward cuts the inputs along ``dim``, replicates the module, applies
replica ``i`` to chunk ``i`` in thread ``i`` and concatenates the outputs on ``output_device``.
The rule kept: every replica is tied to the original parameters by autograd, so one
``backward()`` on the gathered output leaves in each parameter's ``.grad`` the sum over replicas,
which equals the gradient of one module applied to the whole batch.

On a machine without CUDA, DataParallel runs the wrapped module as it is, as torch does (no
split, no replicas; ``data_parallel`` raises torch's error). Splitting the batch over CPU
replicas is there when asked for explicitly, with ``cpu_replicas=N`` (a keyword torch does not
have): replicas read the parameters through autograd views (no copy), and replica 0 shares the
buffers of the original module (so BatchNorm's running statistics are updated, as on torch's
``device_ids[0]``). With CUDA, replicas live on the given GPUs and are differentiable copies.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from itertools import chain
from typing import Any

import torch
from torch import nn
from torch._utils import ExceptionWrapper

from ringtorch._device import place

__all__ = ["DataParallel", "data_parallel", "gather", "parallel_apply", "replicate", "scatter",
           "scatter_kwargs"]

DeviceLike = int | str | torch.device


def _device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _to_device(device: DeviceLike, device_type: str | None = None) -> torch.device:
    """An int means a CUDA index where CUDA exists, a CPU replica number elsewhere."""
    if isinstance(device, torch.device):
        return device
    if isinstance(device, str):
        return torch.device("cpu") if device == "cpu" else torch.device(device)
    if device == -1 or (device_type or _device_type()) == "cpu":
        return torch.device("cpu")
    return torch.device(device_type or _device_type(), device)


def _cpu_replica_ids(cpu_replicas: int | None, device_ids: Sequence[DeviceLike] | None) -> list[int]:
    """``device_ids`` numbering ``cpu_replicas`` CPU replicas, after checking the request.

    Raises:
        ValueError: not a positive int, given together with device_ids, or CUDA is present
            (there, ints name GPUs: pass ``device_ids``).
    """
    if isinstance(cpu_replicas, bool) or not isinstance(cpu_replicas, int) or cpu_replicas < 1:
        raise ValueError(f"cpu_replicas must be a positive number of replicas, got {cpu_replicas!r}")
    if device_ids is not None:
        raise ValueError("pass either device_ids (CUDA devices) or cpu_replicas (replicas on the "
                         "CPU), not both")
    if torch.cuda.is_available():
        raise ValueError("cpu_replicas splits the batch over CPU replicas on a machine without "
                         "CUDA; here CUDA is available: pass device_ids to use the GPUs")
    return list(range(cpu_replicas))


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_asdict") and hasattr(obj, "_fields")


def scatter(inputs: Any, target_devices: Sequence[DeviceLike], dim: int = 0) -> Any:
    """Cut every tensor in ``inputs`` into ``len(target_devices)`` chunks along ``dim``.

    Tuples, lists, dicts and namedtuples are walked; other objects are shared by reference.
    Returns one entry per device that received a chunk (fewer when a tensor is shorter than
    the number of devices). The chunks are differentiable (views on CPU, copies on CUDA).
    """
    devices = [_to_device(d) for d in target_devices]

    def scatter_map(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            chunks = obj.chunk(len(devices), dim)
            return tuple(c.to(d) for c, d in zip(chunks, devices, strict=False))
        if _is_namedtuple(obj):
            return [type(obj)(*args) for args in zip(*map(scatter_map, obj), strict=False)]
        if isinstance(obj, tuple) and len(obj) > 0:
            return list(zip(*map(scatter_map, obj), strict=False))
        if isinstance(obj, list) and len(obj) > 0:
            return [list(i) for i in zip(*map(scatter_map, obj), strict=False)]
        if isinstance(obj, dict) and len(obj) > 0:
            return [type(obj)(i) for i in zip(*map(scatter_map, obj.items()), strict=False)]
        return [obj for _ in devices]

    return scatter_map(inputs)


def scatter_kwargs(inputs: tuple[Any, ...], kwargs: dict[str, Any] | None,
                   target_devices: Sequence[DeviceLike], dim: int = 0
                   ) -> tuple[tuple[Any, ...], tuple[dict[str, Any], ...]]:
    """:func:`scatter` for positional and keyword arguments, padded to the same length."""
    scattered_inputs = scatter(inputs, target_devices, dim) if inputs else []
    scattered_kwargs = scatter(kwargs, target_devices, dim) if kwargs else []
    if len(scattered_inputs) < len(scattered_kwargs):
        scattered_inputs.extend(() for _ in range(len(scattered_kwargs) - len(scattered_inputs)))
    elif len(scattered_kwargs) < len(scattered_inputs):
        scattered_kwargs.extend({} for _ in range(len(scattered_inputs) - len(scattered_kwargs)))
    return tuple(scattered_inputs), tuple(scattered_kwargs)


def _copies(tensors: list[torch.Tensor], devices: list[torch.device], src: torch.device,
            detach: bool, share_first: bool) -> list[list[torch.Tensor]]:
    """Per device, one tensor per input: autograd views on the source device, copies elsewhere."""
    per_device = []
    for j, device in enumerate(devices):
        row = []
        for t in tensors:
            base = t.detach() if detach else t
            if device != src:
                row.append(base.to(device))
            elif share_first and j == 0:
                row.append(t)
            elif share_first:
                row.append(base.detach().clone())
            else:
                row.append(base.view_as(base))
        per_device.append(row)
    return per_device


def replicate(network: nn.Module, devices: Sequence[DeviceLike], detach: bool = False
              ) -> list[nn.Module]:
    """Make one replica of ``network`` per device, wired to its parameters by autograd.

    Parameters become differentiable views (same device) or copies (other device) unless
    ``detach``; buffers are shared with replica 0 on the source device and copied for others.
    """
    if not devices:
        return []
    target = [_to_device(d) for d in devices]
    params = list(network.parameters())
    src = params[0].device if params else target[0]
    param_copies = _copies(params, target, src, detach, share_first=False)
    buffers = list(network.buffers())
    buffer_copies = _copies(buffers, target, src, detach=True, share_first=True)
    param_index = {id(p): i for i, p in enumerate(params)}
    buffer_index = {id(b): i for i, b in enumerate(buffers)}
    modules = list(network.modules())
    module_index = {id(m): i for i, m in enumerate(modules)}
    copies: list[list[nn.Module]] = [[] for _ in target]
    for module in modules:
        for j in range(len(target)):
            replica = module._replicate_for_data_parallel()
            replica._former_parameters = OrderedDict()
            copies[j].append(replica)
    for i, module in enumerate(modules):
        for j, replica_row in enumerate(copies):
            replica = replica_row[i]
            for key, child in module._modules.items():
                if child is None:
                    replica._modules[key] = None
                else:
                    setattr(replica, key, replica_row[module_index[id(child)]])
            for key, param in module._parameters.items():
                if param is None:
                    replica._parameters[key] = None
                else:
                    copy = param_copies[j][param_index[id(param)]]
                    setattr(replica, key, copy)  # a non-leaf tensor: an attribute, not a Parameter
                    replica._former_parameters[key] = copy
            for key, buf in module._buffers.items():
                if buf is None:
                    replica._buffers[key] = None
                else:
                    setattr(replica, key, buffer_copies[j][buffer_index[id(buf)]])
    return [row[0] for row in copies]


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    items = obj.items() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    for item in items:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 takes no argument and answers for CUDA
        return torch.is_autocast_enabled() if device_type == "cuda" else False


def _run_replica(module: nn.Module, inputs: Any, kwargs: dict[str, Any],
                 device: torch.device | None, grad_enabled: bool) -> Any:
    torch.set_grad_enabled(grad_enabled)
    if device is None:
        tensor = _first_tensor(inputs)
        device = tensor.device if tensor is not None else torch.device("cpu")
    if not isinstance(inputs, (list, tuple)):
        inputs = (inputs,)
    with torch.autocast(device.type, enabled=_autocast_enabled(device.type)):
        if device.type == "cuda":
            with torch.cuda.device(device), torch.cuda.stream(torch.cuda.current_stream(device)):
                return module(*inputs, **kwargs)
        return module(*inputs, **kwargs)


def parallel_apply(modules: Sequence[nn.Module], inputs: Sequence[Any],
                   kwargs_tup: Sequence[dict[str, Any]] | None = None,
                   devices: Sequence[DeviceLike | None] | None = None) -> list[Any]:
    """Apply ``modules[i]`` to ``inputs[i]`` in thread ``i``; re-raise the first failure.

    Raises:
        AssertionError: the sequences have different lengths (torch's wording).
        Exception: the type a replica raised, its message naming the replica.
    """
    for name, other in (("inputs", inputs), ("kwargs_tup", kwargs_tup), ("devices", devices)):
        if other is not None and len(other) != len(modules):
            raise AssertionError(f"The number of modules {len(modules)} is not equal to "
                                 f"the number of {name} {len(other)}")
    kwargs_tup = kwargs_tup if kwargs_tup is not None else [{}] * len(modules)
    targets = [None if d is None else _to_device(d) for d in (devices or [None] * len(modules))]
    grad_enabled = torch.is_grad_enabled()
    results: dict[int, Any] = {}

    def worker(i: int) -> None:
        try:
            results[i] = _run_replica(modules[i], inputs[i], kwargs_tup[i], targets[i],
                                      grad_enabled)
        except Exception:
            results[i] = ExceptionWrapper(where=f"in replica {i} on device {targets[i]}")

    if len(modules) > 1:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(modules))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elif modules:
        worker(0)
    outputs = []
    for i in range(len(modules)):
        if isinstance(results[i], ExceptionWrapper):
            results[i].reraise()
        outputs.append(results[i])
    return outputs


def gather(outputs: Any, target_device: DeviceLike, dim: int = 0) -> Any:
    """Concatenate the replicas' outputs along ``dim`` on ``target_device`` (-1 or 'cpu': CPU)."""
    device = _to_device(target_device)

    def gather_map(outs: Sequence[Any]) -> Any:
        out = outs[0]
        if isinstance(out, torch.Tensor):
            if dim == 0 and all(t.dim() == 0 for t in outs):
                warnings.warn("Was asked to gather along dimension 0, but all input tensors "
                              "were scalars; will instead unsqueeze and return a vector.",
                              stacklevel=4)
                outs = [t.view(1) for t in outs]
            return torch.cat([t.to(device) for t in outs], dim)
        if out is None:
            return None
        if isinstance(out, dict):
            if not all(len(out) == len(d) for d in outs):
                raise ValueError("All dicts must have the same number of keys")
            return type(out)((k, gather_map([d[k] for d in outs])) for k in out)
        if _is_namedtuple(out):
            return type(out)._make(map(gather_map, zip(*outs, strict=True)))
        return type(out)(map(gather_map, zip(*outs, strict=True)))

    return gather_map(outputs)


def _check_on_source(module: nn.Module, src: torch.device) -> None:
    for t in chain(module.parameters(), module.buffers()):
        if t.device != src:
            raise RuntimeError("module must have its parameters and buffers "
                               f"on device {src} (device_ids[0]) but found one of "
                               f"them on device: {t.device}")


class DataParallel(nn.Module):
    """Implements data parallelism at the module level, in one process (torch's signature).

    Without CUDA and without ``cpu_replicas``, the module runs as it is (torch's behaviour):
    ``device_ids`` is then ignored and set to ``[]``. To split each batch over CPU replicas
    run in threads, ask for it: ``DataParallel(model, cpu_replicas=4)``.

    Args:
        module: the module to parallelize; its parameters and buffers must be on
            ``device_ids[0]`` (the CPU for CPU replicas).
        device_ids: CUDA device indices (default: all).
        output_device: where the gathered output goes (default: ``device_ids[0]``; -1 is CPU).
        dim: the dimension inputs are scattered and outputs gathered along.
        cpu_replicas: on a machine without CUDA, split each batch over this many CPU replicas
            (ringtorch only; torch has no CPU mode).

    Raises:
        ValueError: ``cpu_replicas`` is not a positive int, comes with ``device_ids``, or CUDA
            is available.
    """

    def __init__(self, module: nn.Module, device_ids: Sequence[DeviceLike] | None = None,
                 output_device: DeviceLike | None = None, dim: int = 0, *,
                 cpu_replicas: int | None = None) -> None:
        super().__init__()
        self.module = module
        self.dim = dim
        if cpu_replicas is None and self._on_simulated_device(device_ids, output_device):
            return
        if cpu_replicas is not None:
            device_type, device_ids = "cpu", _cpu_replica_ids(cpu_replicas, device_ids)
        elif not torch.cuda.is_available():
            self.device_ids: list[DeviceLike] = []  # torch: no accelerator, no parallelism
            return
        else:
            device_type = "cuda"
            device_ids = (list(range(torch.cuda.device_count())) if device_ids is None
                          else list(device_ids))
        self.device_ids = device_ids
        if not device_ids:
            return
        self.output_device = device_ids[0] if output_device is None else output_device
        self.src_device_obj = _to_device(device_ids[0], device_type)
        if len(device_ids) == 1:
            self.module.to(self.src_device_obj)

    def _on_simulated_device(self, device_ids: Sequence[DeviceLike] | None,
                             output_device: DeviceLike | None) -> bool:
        """A module in the simulated runtime's device memory (``_device.place``; CUDA
        modules need no such step): its one device, 0, as torch's on a one-GPU machine."""
        rt = place.runtime_of(chain(self.module.parameters(), self.module.buffers()))
        if not place.is_sim(rt):
            return False
        if not place.training_opened():
            raise RuntimeError(place.CLOSED.format(what="DataParallel on a GPU module"))
        ids = [0] if device_ids is None else [_to_device(d, "cuda").index or 0
                                               for d in device_ids]
        if ids != [0]:
            raise ValueError(f"the simulated device runtime has one device, 0; got device_ids "
                             f"{list(device_ids or [])}")
        self.device_ids = [0]
        self.output_device = 0 if output_device is None else output_device
        self.src_device_obj = rt.device(0)  # type: ignore[union-attr]
        return True

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if not self.device_ids:
            return self.module(*inputs, **kwargs)
        _check_on_source(self.module, self.src_device_obj)
        inputs, module_kwargs = self.scatter(inputs, kwargs, self.device_ids)
        if not inputs and not module_kwargs:  # no inputs at all: run once on device_ids[0]
            inputs, module_kwargs = ((),), ({},)
        if len(self.device_ids) == 1:
            return self.module(*inputs[0], **module_kwargs[0])
        replicas = self.replicate(self.module, self.device_ids[:len(inputs)])
        outputs = self.parallel_apply(replicas, inputs, module_kwargs)
        return self.gather(outputs, self.output_device)

    def replicate(self, module: nn.Module, device_ids: Sequence[DeviceLike]) -> list[nn.Module]:
        return replicate(module, device_ids, not torch.is_grad_enabled())

    def scatter(self, inputs: tuple[Any, ...], kwargs: dict[str, Any] | None,
                device_ids: Sequence[DeviceLike]) -> Any:
        return scatter_kwargs(inputs, kwargs, device_ids, dim=self.dim)

    def parallel_apply(self, replicas: Sequence[nn.Module], inputs: Sequence[Any],
                       kwargs: Any) -> list[Any]:
        return parallel_apply(replicas, inputs, kwargs, self.device_ids[:len(replicas)])

    def gather(self, outputs: Any, output_device: DeviceLike) -> Any:
        return gather(outputs, output_device, dim=self.dim)


def data_parallel(module: nn.Module, inputs: Any, device_ids: Sequence[DeviceLike] | None = None,
                  output_device: DeviceLike | None = None, dim: int = 0,
                  module_kwargs: dict[str, Any] | None = None, *,
                  cpu_replicas: int | None = None) -> Any:
    """The functional form of :class:`DataParallel`: ``module(inputs)`` over ``device_ids``.

    Without CUDA it raises torch's error, unless ``cpu_replicas`` asks for CPU replicas.

    Raises:
        RuntimeError: no CUDA and no ``cpu_replicas`` ("device type could not be determined").
        ValueError: a bad ``cpu_replicas`` (see :class:`DataParallel`).
    """
    if not isinstance(inputs, tuple):
        inputs = (inputs,) if inputs is not None else ()
    if cpu_replicas is not None:
        device_ids = _cpu_replica_ids(cpu_replicas, device_ids)
    elif not torch.cuda.is_available():
        raise RuntimeError("device type could not be determined")
    elif device_ids is None:
        device_ids = list(range(torch.cuda.device_count()))
    device_ids = list(device_ids)
    if not device_ids:
        raise RuntimeError("no available devices were found")
    output_device = device_ids[0] if output_device is None else output_device
    _check_on_source(module, _to_device(device_ids[0]))
    inputs, kwargs = scatter_kwargs(inputs, module_kwargs, device_ids, dim)
    if not inputs and not kwargs:
        inputs, kwargs = ((),), ({},)
    if len(device_ids) == 1:
        return module(*inputs[0], **kwargs[0])
    used = device_ids[:len(inputs)]
    replicas = replicate(module, used)
    return gather(parallel_apply(replicas, inputs, kwargs, used), output_device, dim)

"""RPC device maps: tensors in device memory sent to a worker arrive on the device the map
names (torch's ``TensorPipeRpcBackendOptions.device_maps``/``devices``; feature
``gpu_training``, closed until a recorded GPU run).

A device tensor (a CUDA tensor; on the simulated runtime, its device memory, which counts as
``cuda:0``) is staged through host memory: copied to the host when its message is pickled,
sent like any CPU tensor, and moved to the target device of the receiving process when the
message is loaded. The target is the sender's map for that worker (a request); where the
sender has none, the inverse of the receiver's map for the sender (torch applies the caller's
map reversed to what the callee returns). Each worker publishes its maps in the RPC store at
init, so any worker can read a peer's. With neither, torch's error names the destination.

Rule kept: while the feature is closed, options with device maps or devices are refused at
``init_rpc`` and a CUDA tensor is refused with today's message; nothing here runs for CPU
tensors.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import torch

from ringtorch._device import place
from ringtorch.distributed.rpc._state import STATE

_KEY = "rpc_device_maps/{name}"
NO_MAP = ("TensorPipe RPC backend only supports CPU tensors by default, please move your "
          "tensors to CPU before sending them over RPC, or call `set_device_map` on "
          "`TensorPipeRpcBackendOptions` to explicitly configure device mapping. Request "
          "device mapping is not available for destination {dst}")


class _State:
    """Peers' published maps, read once each (this subsystem's one state object)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.maps: dict[str, dict[str, dict[int, int]]] = {}


_state = _State()


def check_options(options: Any) -> None:
    """At ``init_rpc``: device maps and devices need the feature; devices must be CUDA ones.

    Raises:
        ValueError: the feature is closed (today's message, and how to open it), or a device
            that is not a CUDA device (torch's message).
    """
    if not (options.device_maps or options.devices):
        return
    if not place.training_opened():
        raise ValueError("ringtorch RPC moves CPU tensors only: device_maps and devices must "
                         "be empty (move CUDA tensors to the CPU before sending them); RPC "
                         "device maps have not been confirmed on a GPU yet (docs/gpu.md), "
                         "RINGTORCH_DEVICE_UNCONFIRMED=1 opens them for testing")
    for device in options.devices:
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError("`set_devices` expect a list of CUDA devices, but got device "
                             f"type {device.type}.")
    for callee in options.device_maps.values():
        for src, dst in callee.items():
            if src.type != "cuda" or dst.type != "cuda":
                raise ValueError(f"device maps map CUDA devices; got {src} -> {dst}")


def publish(store: Any, name: str, options: Any) -> None:
    """Put this worker's maps (callee -> {device index: device index}) in the RPC store."""
    maps = {callee: {str(s.index or 0): d.index or 0 for s, d in m.items()}
            for callee, m in options.device_maps.items()}
    store.set(_KEY.format(name=name), json.dumps(maps))


def _maps_of(name: str) -> dict[str, dict[int, int]]:
    with _state.lock:
        found = _state.maps.get(name)
    if found is None:
        raw = json.loads(_agent()._store.get(_KEY.format(name=name)))
        found = {callee: {int(s): d for s, d in m.items()} for callee, m in raw.items()}
        with _state.lock:
            _state.maps[name] = found
    return found


def _agent() -> Any:
    """The running agent (a message is being pickled or loaded: there is one)."""
    agent = STATE.agent
    assert agent is not None
    return agent


def device_index(tensor: torch.Tensor) -> int | None:
    """The device of ``tensor`` if it is in device memory (a CUDA tensor, or the simulated
    runtime's memory: device 0), else None."""
    if tensor.is_cuda:
        return tensor.device.index or 0
    rt = place.runtime_of((tensor,))
    return None if rt is None else 0


def target(index: int, dst: int) -> int:
    """The device on worker ``dst`` (a rank) that a tensor on device ``index`` goes to.

    Raises:
        RuntimeError: no map names it (torch's message).
    """
    agent = _agent()
    me, them = agent.info.name, agent.get_worker_info(dst).name
    mine = _maps_of(me).get(them, {})
    if index in mine:
        return mine[index]
    for src, dst_index in _maps_of(them).get(me, {}).items():
        if dst_index == index:  # a reply to a caller whose map sends its device here
            return src
    raise RuntimeError(NO_MAP.format(dst=them))


def rebuild_on_device(index: int, requires_grad: bool, host: torch.Tensor) -> torch.Tensor:
    """A received tensor, moved to device ``index`` of this process's runtime."""
    out = place.to_device(host.detach(), index)
    return out.requires_grad_(requires_grad) if requires_grad else out


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A host copy of a device tensor, after the work queued on the current stream."""
    if tensor.is_cuda:
        return tensor.detach().to("cpu")
    place.fence(place.runtime_of((tensor,)))
    return tensor.detach().clone()

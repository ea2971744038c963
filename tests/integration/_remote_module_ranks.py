"""Rank-side code of the RemoteModule tests: worker0 drives, worker1 holds the modules,
worker2 receives RemoteModules over RPC. Each scenario returns what worker0 saw; the tests
compare it with the same module run locally."""

from __future__ import annotations

import pickle
from typing import Any

import torch
from torch import nn

import ringtorch.distributed.autograd as dist_autograd
import ringtorch.distributed.rpc as rpc
from ringtorch.distributed.nn import RemoteModule
from ringtorch.distributed.optim import DistributedOptimizer
from tests.integration._rpc_common import error_of, start


class Scaled(nn.Module):
    """A module with a forward taking keyword arguments and a submodule."""

    def __init__(self, n: int, *, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.inner = nn.Linear(n, n)
        self.gain = nn.Parameter(torch.full((n,), 2.0))

    def forward(self, x: torch.Tensor, *, shift: float = 0.0) -> torch.Tensor:
        return torch.tanh(self.inner(x)) * self.gain + shift


def not_a_module() -> int:
    return 3


def forward_there(module: RemoteModule, x: torch.Tensor) -> dict[str, Any]:
    """(on worker2) use a RemoteModule that came in an RPC, and send one back."""
    return {"out": module.forward(x, shift=1.0), "on": module.on, "device": module.device,
            "owner": module.get_module_rref().owner().name, "back": module}


def training_flag(module_rref: rpc.RRef[nn.Module]) -> bool:
    return module_rref.local_value().training


def scenario(rank: int, ws: int) -> dict[str, Any]:
    start(rank, ws)
    out: dict[str, Any] = {}
    if rank == 0:
        x = torch.arange(8.0).reshape(2, 4) / 8
        rm = RemoteModule("worker1/cpu", Scaled, args=(4,), kwargs={"seed": 5})
        out["module"] = rm.get_module_rref().to_here()  # a copy, to run locally
        out["owner"] = rm.get_module_rref().owner().name
        out["forward"] = rm.forward(x, shift=0.5)
        out["call"] = rm(x)
        out["forward_async"] = rm.forward_async(x, shift=0.5).wait()
        out["params"] = [p.to_here() for p in rm.remote_parameters()]
        out["params_direct"] = [p.to_here() for p in rm.remote_parameters(recurse=False)]
        out["param_owners"] = {p.owner().name for p in rm.remote_parameters()}
        by_rank = RemoteModule("rank:1/cpu", nn.Linear, args=(4, 2), kwargs={"bias": False})
        out["by_rank"] = (by_rank.on, by_rank.device, len(by_rank.remote_parameters()))
        by_name = RemoteModule("worker1", nn.Linear, args=(4, 2))
        out["by_name"] = (by_name.on, by_name.device)
        shared = RemoteModule.init_from_module_rref("worker1/cpu", rm.get_module_rref())
        out["shared"] = shared.forward(x, shift=0.5)
        there = rpc.rpc_sync("worker2", forward_there, args=(rm, x))
        out["there"] = {k: v for k, v in there.items() if k != "back"}
        out["back"] = there["back"].forward(x, shift=1.0)
        out["eval"] = (rm.eval() is rm, rm.training,
                       rpc.rpc_sync("worker1", training_flag, args=(rm.get_module_rref(),)))
        rm.train()
        out["train"] = rpc.rpc_sync("worker1", training_flag, args=(rm.get_module_rref(),))
        out["pickle"] = error_of(pickle.dumps, rm)
        bad = RemoteModule("worker1", not_a_module)
        out["not_a_module"] = error_of(bad.get_module_rref().to_here)
        out["unknown_worker"] = error_of(RemoteModule, "nobody/cpu", nn.Linear, (1, 1))
        out["no_worker"] = error_of(RemoteModule, "cpu", nn.Linear, (1, 1))
        out["bad_string"] = error_of(RemoteModule, "a/b/c", nn.Linear, (1, 1))
        out["cuda"] = error_of(RemoteModule, "worker1/cuda:0", nn.Linear, (1, 1))
        out["interface"] = error_of(RemoteModule.init_from_module_rref, "worker1",
                                    rm.get_module_rref(), object)
        # distributed autograd through the remote module, stepped by DistributedOptimizer
        opt = DistributedOptimizer(torch.optim.SGD, rm.remote_parameters(), lr=0.25)
        with dist_autograd.context() as context_id:
            loss = (rm.forward(x) * torch.arange(1.0, 5.0)).sum()
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
        out["stepped"] = [p.to_here() for p in rm.remote_parameters()]
        out["loss"] = loss.detach()
    rpc.shutdown()
    return out

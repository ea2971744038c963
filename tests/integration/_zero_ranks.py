"""Rank-side programs of the ZeroRedundancyOptimizer and Join tests, written once for both stacks.

Each function takes ``stack`` ("torch" or "ringtorch") and runs the same program over that
stack's ``distributed``, DDP, ZeroRedundancyOptimizer and Join; the drivers
(test_zero*.py, test_join_tutorials.py) run it under both and compare what the ranks returned.

Every program deletes its DDP and optimizer before ``destroy_process_group``: under torch they
hold the gloo group, and one that outlives ``destroy_process_group`` frees the group itself on
its way out, which can deadlock on the GIL (seen: the freeing thread holds it while joining
torch's gloo runloop thread, which waits for it).
"""

from __future__ import annotations

import functools
import importlib
import types
import warnings
from typing import Any

import torch
from torch import nn

STEPS = 3


def stack(name: str) -> types.SimpleNamespace:
    """The modules a training program imports, from torch or from ringtorch."""
    root = "torch" if name == "torch" else "ringtorch"
    dist = importlib.import_module(f"{root}.distributed")
    join = importlib.import_module(f"{root}.distributed.algorithms.join")
    optim = importlib.import_module(f"{root}.distributed.optim")
    parallel = importlib.import_module(f"{root}.nn.parallel")
    return types.SimpleNamespace(dist=dist, DDP=parallel.DistributedDataParallel,
                                 ZeRO=optim.ZeroRedundancyOptimizer, Join=join.Join,
                                 Joinable=join.Joinable, JoinHook=join.JoinHook)


def init(name: str) -> types.SimpleNamespace:
    s = stack(name)
    warnings.simplefilter("ignore")
    s.dist.init_process_group("gloo")
    return s


class Net(nn.Module):
    """Parameters of several sizes, with ties (two 16x16 weights), so the partition is telling."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, 16)
        self.d = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.d(torch.tanh(self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))))


def make_net() -> Net:
    torch.manual_seed(0)
    return Net()


def groups(net: Net) -> list[dict[str, Any]]:
    """Two param groups with different learning rates."""
    return [{"params": [*net.a.parameters(), *net.b.parameters()]},
            {"params": [*net.c.parameters(), *net.d.parameters()], "lr": 0.02}]


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(4, 8, generator=g), torch.randn(4, 4, generator=g)


def _optimizer(name: str) -> tuple[type[torch.optim.Optimizer], dict[str, Any]]:
    if name == "adam":
        return torch.optim.Adam, {"lr": 0.01}
    return torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}


def _train(s: types.SimpleNamespace, ddp: nn.Module, zero: Any, rank: int, steps: int,
           first: int = 0) -> None:
    for step in range(first, first + steps):
        zero.zero_grad()
        x, y = batch(rank, step)
        nn.functional.mse_loss(ddp(x), y).backward()
        zero.step()


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _partition(zero: Any, net: nn.Module) -> list[list[list[int]]]:
    """partition[rank][group] = indices (in net.parameters() order) of the params rank owns."""
    index = {p: i for i, p in enumerate(net.parameters())}
    return [[[index[p] for p in g["params"]] for g in rank_groups]
            for rank_groups in zero._partition_parameters()]


def train(rank: int, world_size: int, name: str, cases: list[tuple[str, bool]]
          ) -> list[dict[str, Any]]:
    """DDP + ZeroRedundancyOptimizer for each (optimizer, parameters_as_bucket_view) case."""
    s = init(name)
    out = []
    for optimizer, bucket_view in cases:
        net = make_net()
        ddp = s.DDP(net)
        cls, kwargs = _optimizer(optimizer)
        zero = s.ZeRO(groups(net), cls, parameters_as_bucket_view=bucket_view, **kwargs)
        _train(s, ddp, zero, rank, STEPS)
        out.append({"state": _state(net), "partition": _partition(zero, net),
                    "local_state_numel": sum(t.numel() for st in zero.optim.state.values()
                                             for t in st.values() if torch.is_tensor(t))})
    del ddp, zero  # before destroy_process_group (module docstring)
    s.dist.destroy_process_group()
    return out


def _message(fn: Any) -> tuple[str, str]:
    try:
        fn()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


def consolidate(rank: int, world_size: int, name: str, path: str) -> dict[str, Any]:
    """Train, consolidate to rank 1, save rank 1's state dict to ``path``; report the errors."""
    s = init(name)
    net = make_net()
    ddp = s.DDP(net)
    zero = s.ZeRO(groups(net), torch.optim.Adam, lr=0.01)
    out: dict[str, Any] = {"before": _message(zero.state_dict)}
    _train(s, ddp, zero, rank, STEPS)
    zero.consolidate_state_dict(to=1)
    if rank == 1:
        out["state_dict"] = zero.state_dict()
        torch.save(out["state_dict"], path)
    else:
        out["other_rank"] = _message(zero.state_dict)
    bad = {"state": {}, "param_groups": [{"params": [0, 1], "lr": 0.01}]}
    out["fewer_groups"] = _message(functools.partial(zero.load_state_dict, bad))
    bad = {"state": {}, "param_groups": [{"params": [0]}, {"params": [1, 2, 3, 4]}]}
    out["group_size"] = _message(functools.partial(zero.load_state_dict, bad))
    if name == "ringtorch":  # torch silently consolidates nowhere; ringtorch refuses
        out["bad_to"] = _message(functools.partial(zero.consolidate_state_dict, to=2))
    del ddp, zero  # before destroy_process_group (module docstring)
    s.dist.destroy_process_group()
    return out


def load_elsewhere(rank: int, world_size: int, name: str, path: str) -> dict[str, Any]:
    """Load a state dict saved at another world size, train on, consolidate again to rank 0."""
    s = init(name)
    net = make_net()
    ddp = s.DDP(net)
    zero = s.ZeRO(groups(net), torch.optim.Adam, lr=0.01)
    zero.load_state_dict(torch.load(path, weights_only=False))
    loaded_lr = [g["lr"] for g in zero.param_groups]
    _train(s, ddp, zero, rank, STEPS, first=STEPS)
    zero.consolidate_state_dict()
    out = {"state": _state(net), "loaded_lr": loaded_lr,
           "state_dict": zero.state_dict() if rank == 0 else None}
    del ddp, zero  # before destroy_process_group (module docstring)
    s.dist.destroy_process_group()
    return out


def add_group(rank: int, world_size: int, name: str, bucket_view: bool) -> dict[str, Any]:
    """Start with net.a and net.b; after one step add net.c and net.d as a second group."""
    s = init(name)
    net = make_net()
    ddp = s.DDP(net)
    zero = s.ZeRO(groups(net)[:1], torch.optim.SGD, lr=0.05, momentum=0.9,
                  parameters_as_bucket_view=bucket_view)
    _train(s, ddp, zero, rank, 1)
    zero.add_param_group(groups(net)[1])
    _train(s, ddp, zero, rank, STEPS, first=1)
    out = {"state": _state(net), "partition": _partition(zero, net),
           "lrs": [g["lr"] for g in zero.param_groups]}
    del ddp, zero  # before destroy_process_group (module docstring)
    s.dist.destroy_process_group()
    return out


def uneven(rank: int, world_size: int, name: str, lengths: list[int], optimizer: str,
           bucket_view: bool) -> dict[str, Any]:
    """DDP + ZeroRedundancyOptimizer under Join; rank r has lengths[r] batches."""
    s = init(name)
    net = make_net()
    ddp = s.DDP(net)
    cls, kwargs = _optimizer(optimizer)
    zero = s.ZeRO(net.parameters(), cls, parameters_as_bucket_view=bucket_view, **kwargs)
    with s.Join([ddp, zero]):
        _train(s, ddp, zero, rank, lengths[rank])
    out = {"state": _state(net)}
    del ddp, zero  # before destroy_process_group (module docstring)
    s.dist.destroy_process_group()
    return out


def subgroup(rank: int, world_size: int, name: str) -> dict[str, Any] | None:
    """Ranks 1 and 2 shard over the group [1, 2] (group rank != global rank); rank 0 stays out."""
    s = init(name)
    group = s.dist.new_group([1, 2])
    out = None
    if rank in (1, 2):
        net = make_net()
        ddp = s.DDP(net, process_group=group)
        zero = s.ZeRO(groups(net), torch.optim.Adam, process_group=group, lr=0.01)
        _train(s, ddp, zero, rank, STEPS)
        zero.consolidate_state_dict(to=1)
        out = {"state": _state(net), "partition": _partition(zero, net),
               "state_dict": zero.state_dict() if rank == 2 else None}
        del ddp, zero  # before destroy_process_group (module docstring)
    s.dist.barrier()
    s.dist.destroy_process_group()
    return out


def freeze(rank: int, world_size: int, name: str, bucket_view: bool) -> dict[str, Any]:
    """Without DDP (every rank the same batch): freeze net.b.weight after one step."""
    s = init(name)
    net = make_net()
    zero = s.ZeRO(net.parameters(), torch.optim.SGD, lr=0.05, momentum=0.9,
                  parameters_as_bucket_view=bucket_view)
    for step in range(STEPS):
        if step == 1:
            net.b.weight.requires_grad_(False)
        zero.zero_grad()
        x, y = batch(0, step)
        nn.functional.mse_loss(net(x), y).backward()
        zero.step()
    out = {"state": _state(net)}
    del zero  # before destroy_process_group (module docstring)
    s.dist.destroy_process_group()
    return out


def non_member(rank: int, world_size: int, name: str) -> tuple[str, str] | None:
    """Rank 1 builds a ZeroRedundancyOptimizer over a group it is not in ([0])."""
    s = init(name)
    group = s.dist.new_group([0])
    out = None
    if rank == 1:
        out = _message(lambda: s.ZeRO(make_net().parameters(), torch.optim.SGD,
                                      process_group=group, lr=0.1))
    s.dist.barrier()
    s.dist.destroy_process_group()
    return out

"""torch's "uneven inputs with the Join context manager" tutorial, as rank-side programs.

Written once against either stack (``_zero_ranks.stack``): DDP alone, DDP with
ZeroRedundancyOptimizer, and a user-written Joinable (a counter that all-reduces a one per
input, whose hook shadows that all_reduce and, at the end, shares the largest count).

Every program deletes what holds torch's gloo group (DDP, the optimizer, the counter) before
``destroy_process_group``: one that outlives it frees the group on its way out, which can
deadlock on the GIL (seen: the freeing thread holds it while joining torch's gloo runloop
thread, which waits for it).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from tests.integration._zero_ranks import init


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(1, 1)


def _inputs(rank: int, base: int) -> list[torch.Tensor]:
    """Rank r gets ``base + r`` inputs, as in the tutorial."""
    return [torch.tensor([1.0 + i]) for i in range(base + rank)]


def ddp_only(rank: int, world_size: int, name: str, base: int) -> dict[str, Any]:
    s = init(name)
    model = s.DDP(_tiny_model())
    seen = 0
    with s.Join([model]):
        for x in _inputs(rank, base):
            seen += 1
            model(x).sum().backward()
    out = {"seen": seen, "grad": [p.grad.clone() for p in model.parameters()]}
    del model  # before destroy_process_group (module docstring)
    s.dist.destroy_process_group()
    return out


def ddp_and_zero(rank: int, world_size: int, name: str, base: int) -> dict[str, Any]:
    s = init(name)
    model = s.DDP(_tiny_model())
    optim = s.ZeRO(model.parameters(), torch.optim.Adam, lr=0.01)
    seen = 0
    with s.Join([model, optim]):
        for x in _inputs(rank, base):
            seen += 1
            model(x).sum().backward()
            optim.step()
    out = {"seen": seen, "params": [p.detach().clone() for p in model.parameters()]}
    del model, optim  # before destroy_process_group (module docstring)
    s.dist.destroy_process_group()
    return out


def _counter_classes(s: types.SimpleNamespace) -> tuple[type, type]:
    """The tutorial's Counter and CounterJoinHook, over stack ``s``."""

    class CounterJoinHook(s.JoinHook):
        def __init__(self, counter: Any, sync_max_count: bool) -> None:
            self.counter = counter
            self.sync_max_count = sync_max_count

        def main_hook(self) -> None:
            """Shadow the counter's all_reduce with a zero."""
            s.dist.all_reduce(torch.zeros(1), group=self.counter.process_group)

        def post_hook(self, is_last_joiner: bool) -> None:
            """Give every rank the count of the last rank to join (the largest)."""
            if not self.sync_max_count:
                return
            rank = s.dist.get_rank(self.counter.process_group)
            common = self.counter.find_common_rank(rank, is_last_joiner)
            if rank == common:
                self.counter.max_count = self.counter.count.detach().clone()
            s.dist.broadcast(self.counter.max_count, src=common,
                             group=self.counter.process_group)

    class Counter(s.Joinable):
        """Counts the inputs processed by all ranks together."""

        def __init__(self, device: torch.device, process_group: Any) -> None:
            super().__init__()
            self.device = device
            self.process_group = process_group
            self.count = torch.zeros(1, device=device)
            self.max_count = torch.zeros(1, device=device)

        def __call__(self) -> None:
            s.Join.notify_join_context(self)
            one = torch.ones(1, device=self.device)
            s.dist.all_reduce(one, group=self.process_group)
            self.count += one

        def join_hook(self, **kwargs: Any) -> Any:
            return CounterJoinHook(self, kwargs.get("sync_max_count", False))

        @property
        def join_device(self) -> torch.device:
            return self.device

        @property
        def join_process_group(self) -> Any:
            return self.process_group

        def find_common_rank(self, rank: int, to_consider: bool) -> int:
            candidate = torch.tensor([rank if to_consider else -1], device=self.device)
            s.dist.all_reduce(candidate, op=s.dist.ReduceOp.MAX, group=self.process_group)
            return int(candidate.item())

    return Counter, CounterJoinHook


def counter(rank: int, world_size: int, name: str, base: int) -> dict[str, int]:
    s = init(name)
    counter_class, _ = _counter_classes(s)
    count = counter_class(torch.device("cpu"), s.dist.group.WORLD)
    with s.Join([count], sync_max_count=True):
        for _ in _inputs(rank, base):
            count()
    out = {"count": int(count.count.item()), "max_count": int(count.max_count.item())}
    del count  # before destroy_process_group (module docstring)
    s.dist.destroy_process_group()
    return out

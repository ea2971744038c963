"""Rank-side code of the DDP tests: each function runs on every rank of a run_ranks world.

The driver (test_ddp*.py) builds the data and the expected values with plain torch in one
process; the functions here only train with DistributedDataParallel and return what they saw.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

from ringtorch import distributed as dist
from ringtorch.nn.parallel import DistributedDataParallel as DDP
from ringtorch.nn.parallel import Join, comm_hooks
from ringtorch.nn.parallel import reducer as reducer_module


class Net(nn.Module):
    """Three layers on the main path and a side layer some scenarios leave unused."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.l1 = nn.Linear(8, width)
        self.l2 = nn.Linear(width, width)
        self.l3 = nn.Linear(width, 4)
        self.side = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, use_side: bool = True) -> torch.Tensor:
        out = self.l3(torch.tanh(self.l2(torch.tanh(self.l1(x)))))
        return out + self.side(x) if use_side else out


def make_net() -> Net:
    """The same initial weights in every process (the driver's reference included)."""
    torch.manual_seed(0)
    return Net()


BATCH = 4


def make_data(world_size: int, steps: int = 3, micro: int = 1, seed: int = 0,
              lengths: list[int] | None = None) -> list[Any]:
    """data[step][rank] = `micro` (x, y) batches; or, with `lengths`, data[rank] = batches.

    Every process builds the same data from the seed: tensors passed to a rank would travel
    as shared-memory file descriptors, one per tensor.
    """
    g = torch.Generator().manual_seed(seed)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 4, generator=g)

    if lengths is not None:
        return [[batch() for _ in range(n)] for n in lengths]
    return [[[batch() for _ in range(micro)] for _ in range(world_size)] for _ in range(steps)]


LR = 0.1


@torch.no_grad()
def sgd_step(params: Any) -> None:
    """Plain SGD, as torch.optim.SGD(lr=LR) computes it (whose first use costs 1.7 s of imports)."""
    for p in params:
        if p.grad is not None:
            p.add_(p.grad, alpha=-LR)


def zero_grad(params: Any) -> None:
    for p in params:
        p.grad = None


def _init(world_size: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", world_size=world_size)
    # the test models' buckets are a few KiB: put them in shared memory all the same, so that
    # every scenario (Join's shadow iterations included) runs over shared-memory buckets too
    reducer_module.SHARED_BUCKET_MIN_BYTES = 0


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def train(rank: int, world_size: int, options: dict[str, Any], side: bool | str = True,
          hook: str | None = None, accumulate: int = 1) -> dict[str, Any]:
    """SGD with DDP over ``make_data(...)[step][rank]``; returns the final state and grad info."""
    data = make_data(world_size, micro=accumulate)
    ddp = DDP(make_net(), **options)
    if hook is not None:
        ddp.register_comm_hook(None, getattr(comm_hooks, hook))
    use_side = side if isinstance(side, bool) else rank % 2 == 1
    for step in data:
        zero_grad(ddp.parameters())
        for micro, (x, y) in enumerate(step[rank]):
            synced = micro == len(step[rank]) - 1
            ctx = ddp.no_sync() if not synced else _null()
            with ctx:
                nn.functional.mse_loss(ddp(x, use_side=use_side), y).backward()
        sgd_step(ddp.parameters())
    grads_are_views = [p.grad is not None and p.grad._base is not None for p in ddp.parameters()]
    return {"state": _state(ddp.module), "grad_none": [p.grad is None for p in ddp.parameters()],
            "grads_are_views": grads_are_views, "buckets": ddp.reducer.buckets,
            "in_shared_memory": [_in_dev_shm(b.buffer) for b in ddp.reducer._buckets]}


def _in_dev_shm(tensor: torch.Tensor) -> bool:
    """Whether the tensor's memory is a mapping of a /dev/shm file (read from /proc/self/maps)."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return len(fields) == 6 and fields[5].startswith("/dev/shm/")
    return False


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def scenarios(rank: int, world_size: int, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run every case in one world; each case is keyword arguments of :func:`train`."""
    _init(world_size)
    try:
        return [train(rank, world_size, **case) for case in cases]
    finally:
        dist.destroy_process_group()


def shared_threshold(rank: int, world_size: int) -> dict[str, list[bool]]:
    """Which buckets live in shared memory with the default 1 MiB threshold, for the test net
    with 512-wide layers (l2.weight is 1 MiB; the other buckets are a few KiB)."""
    _init(world_size)
    reducer_module.SHARED_BUCKET_MIN_BYTES = 1 << 20
    try:
        torch.manual_seed(0)
        found = {}
        for view in (False, True):
            ddp = DDP(Net(width=512), gradient_as_bucket_view=view)
            found[f"view={view}"] = [_in_dev_shm(b.buffer) for b in ddp.reducer._buckets]
            found[f"buckets view={view}"] = ddp.reducer.buckets
        return found
    finally:
        dist.destroy_process_group()


def uneven(rank: int, world_size: int, lengths: list[int],
           divide_by_initial_world_size: bool) -> dict[str, Any]:
    """Rank r trains on make_data(lengths=...)[r] (lengths differ) inside ddp.join()."""
    data = make_data(world_size, lengths=lengths)
    _init(world_size)
    try:
        ddp = DDP(make_net())
        with ddp.join(divide_by_initial_world_size=divide_by_initial_world_size):
            for x, y in data[rank]:
                zero_grad(ddp.parameters())
                nn.functional.mse_loss(ddp(x), y).backward()
                sgd_step(ddp.parameters())
        return {"state": _state(ddp.module)}
    finally:
        dist.destroy_process_group()


def uneven_throw(rank: int, world_size: int, batches: list[int]) -> str:
    """With throw_on_early_termination every rank raises once one rank runs out."""
    _init(world_size)
    try:
        ddp = DDP(make_net())
        try:
            with Join([ddp], throw_on_early_termination=True):
                for _ in range(batches[rank]):
                    ddp(torch.ones(2, 8)).sum().backward()
        except RuntimeError as exc:
            return str(exc)
        return "no error"
    finally:
        dist.destroy_process_group()


def construction(rank: int, world_size: int) -> dict[str, Any]:
    """What DDP's constructor does to parameters and buffers; the sampler's defaults."""
    from ringtorch.utils.data import DistributedSampler

    _init(world_size)
    try:
        torch.manual_seed(rank)  # every rank starts from different weights and buffers
        model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
        model[1].running_mean.fill_(float(rank))
        ddp = DDP(model)
        after_init = _state(ddp.module)
        model[1].running_mean.fill_(float(rank) + 10)  # diverge again; forward re-broadcasts
        ddp.eval()
        ddp(torch.ones(2, 4))
        sampler = DistributedSampler(list(range(10)), shuffle=False)
        return {"after_init": after_init, "running_mean_after_forward": model[1].running_mean,
                "keys": list(ddp.state_dict()), "sampler": list(sampler),
                "is_module": ddp.module is model}
    finally:
        dist.destroy_process_group()


def errors(rank: int, world_size: int) -> dict[str, str]:
    """The messages of DDP's error paths, each caught on the rank that raised it."""
    _init(world_size)
    found: dict[str, str] = {}
    try:
        ddp = DDP(make_net())
        ddp(torch.ones(2, 8), use_side=False).sum().backward()
        found["unused"] = _message(lambda: ddp(torch.ones(2, 8), use_side=False))
        ddp = DDP(make_net(), bucket_cap_mb=0)
        out = ddp(torch.ones(2, 8))
        out.sum().backward(retain_graph=True)
        found["second_backward"] = _message(lambda: out.sum().backward())
        ddp = DDP(make_net(), bucket_cap_mb=0)
        model = ddp.module
        ddp(torch.ones(2, 8))
        model.l3.weight.sum().backward()   # l3.weight ready, its buckets' partners not yet
        found["ready_twice"] = _message(lambda: model.l3.weight.sum().backward())
        ddp = DDP(make_net())
        ddp.register_comm_hook(None, comm_hooks.allreduce_hook)
        found["hook_twice"] = _message(lambda: ddp.register_comm_hook(None,
                                                                      comm_hooks.allreduce_hook))
        found["hook_not_callable"] = _message(lambda: ddp.register_comm_hook(None, 42))
        found["no_grad_params"] = _message(lambda: DDP(nn.Linear(2, 2).requires_grad_(False)))
        found["device_ids"] = _message(lambda: DDP(nn.Linear(2, 2), device_ids=[0]))
        found["mismatch"] = _message(lambda: DDP(nn.Linear(2, 2 + rank)))
        return found
    finally:
        dist.destroy_process_group()


def _message(fn: Any) -> str:
    try:
        fn()
    except Exception as exc:  # the test matches type and message
        return f"{type(exc).__name__}: {exc}"
    return "no error"


class _SlowGrad(torch.autograd.Function):
    """Identity whose backward sleeps: the first layer's gradient comes late."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        time.sleep(1.5)
        return grad


class _SlowFirstLayer(Net):
    def forward(self, x: torch.Tensor, use_side: bool = True) -> torch.Tensor:
        h = torch.tanh(self.l1(x))
        h = _SlowGrad.apply(h)  # backward sleeps here, before l1's gradients exist
        return self.l3(torch.tanh(self.l2(h))) + self.side(x)


def overlap(rank: int, world_size: int) -> list[tuple[str, Any]]:
    """Record when bucket all_reduces start and finish relative to the first layer's gradient."""
    _init(world_size)
    events: list[tuple[str, Any]] = []
    try:
        torch.manual_seed(0)
        ddp = DDP(_SlowFirstLayer(), bucket_cap_mb=0)
        real_all_reduce = dist.all_reduce

        def spy(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            index = len([e for e in events if e[0] == "launch"])
            events.append(("launch", index))
            work = real_all_reduce(tensor, *args, **kwargs)
            if work is None:  # synchronous: done when it returns
                events.append(("done", index))
            else:
                work.get_future().then(lambda fut: events.append(("done", index)))
            return work

        ddp.module.l1.weight.register_post_accumulate_grad_hook(
            lambda p: events.append(("grad", "l1.weight")))
        dist.all_reduce = spy
        try:
            ddp(torch.ones(2, 8)).sum().backward()
        finally:
            dist.all_reduce = real_all_reduce
        events.append(("backward returned", None))
        return events
    finally:
        dist.destroy_process_group()


def subgroup(rank: int, world_size: int) -> dict[str, Any] | None:
    """DDP over new_group([1, 2]) of a 3-rank world: rank 0 stays out of it."""
    _init(world_size)
    try:
        group = dist.new_group([1, 2])
        result = None
        if rank != 0:
            torch.manual_seed(rank)  # ranks start apart; DDP broadcasts from the group's rank 0
            ddp = DDP(Net(), process_group=group)
            start = _state(ddp.module)
            x, y = make_data(world_size)[0][rank][0]
            nn.functional.mse_loss(ddp(x), y).backward()
            sgd_step(ddp.parameters())
            result = {"start": start, "state": _state(ddp.module)}
        dist.barrier()  # rank 0 hosts the store: it stays until the others are done
        return result
    finally:
        dist.destroy_process_group()

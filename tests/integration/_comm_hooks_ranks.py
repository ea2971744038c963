"""Rank-side programs of the comm-hook and model-averaging tests, written once for both APIs.

Each function takes the name of the distributed package (``"torch"`` or ``"ringtorch"``),
imports torch's or ringtorch's modules under the same paths, and trains the same model on the
same data; the driver (test_comm_hooks*.py) runs it under both and compares what the ranks
return. Nothing here computes an expected value.
"""

from __future__ import annotations

import importlib
import pickle
import types
import warnings
from typing import Any

import torch
from torch import nn

# Every DDP model stays alive until the rank exits (which frees nothing): under torch, freeing
# a Reducer right after a PowerSGD hook ran on gloo, or after destroy_process_group, can hang
# the process (torch 2.13, CPU: the freeing thread holds the GIL while joining gloo's loop).
_KEEP: list[Any] = []


def api(package: str) -> types.SimpleNamespace:
    """torch's or ringtorch's modules, under the names a training program imports."""
    mod = importlib.import_module
    hooks = f"{package}.distributed.algorithms.ddp_comm_hooks"
    averaging = f"{package}.distributed.algorithms.model_averaging"
    return types.SimpleNamespace(
        dist=mod(f"{package}.distributed"),
        DDP=mod(f"{package}.nn.parallel").DistributedDataParallel,
        hooks=mod(hooks),
        default=mod(f"{hooks}.default_hooks"),
        powerSGD=mod(f"{hooks}.powerSGD_hook"),
        post_local=mod(f"{hooks}.post_localSGD_hook"),
        quantization=mod(f"{hooks}.quantization_hooks"),
        debugging=mod(f"{hooks}.debugging_hooks"),
        averagers=mod(f"{averaging}.averagers"),
        hierarchical=mod(f"{averaging}.hierarchical_model_averager"),
        utils=mod(f"{averaging}.utils"),
        optim=mod(f"{package}.distributed.optim"),
    )


def make_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 4))


def batches(rank: int, steps: int, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each rank's own data, the same under either package."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(batch, 8, generator=g), torch.randn(batch, 4, generator=g))
            for _ in range(steps)]


def _renamed(hook: Any) -> Any:
    """``hook`` under another name: torch refuses its bf16 hooks by name unless NCCL is there,
    though they run on CPU with gloo."""
    def bucket_hook(state, bucket):  # unannotated: torch checks annotations against its own
        return hook(state, bucket)

    return bucket_hook


def _hook_and_state(a: types.SimpleNamespace, case: dict[str, Any]) -> tuple[Any, Any]:
    name = case["hook"]
    if name.startswith("powerSGD") or name.startswith("batched"):
        state = a.powerSGD.PowerSGDState(process_group=None, **case.get("state", {}))
        hook = a.powerSGD.powerSGD_hook if name.startswith("powerSGD") \
            else a.powerSGD.batched_powerSGD_hook
        if case.get("wrap"):
            hook = getattr(a.default, case["wrap"])(hook)
        return hook, state
    if name in ("fp16_compress_wrapper", "bf16_compress_wrapper"):
        return _renamed(getattr(a.default, name)(a.default.allreduce_hook)), None
    if name == "bf16_compress_hook":
        return _renamed(a.default.bf16_compress_hook), None
    for module in (a.default, a.quantization, a.debugging):
        if hasattr(module, name):
            return getattr(module, name), None
    raise KeyError(name)


def train_with_hook(rank: int, world_size: int, package: str, cases: list[dict[str, Any]]
                    ) -> list[dict[str, Any]]:
    """For each case: DDP with the case's hook, ``steps`` SGD steps; the final parameters."""
    a = api(package)
    warnings.simplefilter("ignore")
    a.dist.init_process_group("gloo")
    results = []
    for case in cases:
        model = make_mlp()
        ddp = a.DDP(model, bucket_cap_mb=case.get("bucket_cap_mb"))
        if "register" in case:
            a.hooks.register_ddp_comm_hook(getattr(a.hooks.DDPCommHookType, case["register"]),
                                           ddp)
            state = None
        else:
            hook, state = _hook_and_state(a, case)
            ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in batches(rank, case.get("steps", 5)):
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        out: dict[str, Any] = {"params": {k: v.detach().clone()
                                          for k, v in model.state_dict().items()}}
        if state is not None:
            out["iter"] = state.iter
            out["stats"] = state.compression_stats()
        results.append(out)
        _KEEP.append(ddp)
    a.dist.destroy_process_group()
    return results


def chained_wait_in_callback(rank: int, world_size: int, package: str) -> torch.Tensor:
    """torch's hook pattern: a ``then`` callback starts a collective and waits for it."""
    a = api(package)
    a.dist.init_process_group("gloo")
    t = torch.full((4,), float(rank + 1))

    def second(fut: Any) -> torch.Tensor:
        doubled = fut.value()[0] * 2
        return a.dist.all_reduce(doubled, async_op=True).get_future().wait()[0]

    out = a.dist.all_reduce(t, async_op=True).get_future().then(second).wait()
    a.dist.destroy_process_group()
    return out


def regression(rank: int, world_size: int, package: str, hook: str, state_kwargs: dict,
               steps: int) -> list[float]:
    """Least squares y = x W* (W* of full rank 8) with DDP and a PowerSGD variant (or plain
    all-reduce); the loss over everyone's data after each step."""
    a = api(package)
    a.dist.init_process_group("gloo")
    g = torch.Generator().manual_seed(7)
    w_true = torch.randn(8, 8, generator=g)
    xs = torch.randn(world_size, 64, 8, generator=g)
    ys = xs @ w_true
    torch.manual_seed(0)
    model = nn.Linear(8, 8, bias=False)
    ddp = a.DDP(model)
    if hook != "allreduce":
        state = a.powerSGD.PowerSGDState(None, **state_kwargs)
        ddp.register_comm_hook(state, getattr(a.powerSGD, hook))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(ddp(xs[rank]), ys[rank]).backward()
        opt.step()
        with torch.no_grad():
            losses.append(float(nn.functional.mse_loss(model(xs.reshape(-1, 8)),
                                                       ys.reshape(-1, 8))))
    _KEEP.append(ddp)
    a.dist.destroy_process_group()
    return losses


def one_bucket_grads(rank: int, world_size: int, package: str, hook: str) -> torch.Tensor:
    """One backward of a bias-free linear layer (one parameter, one bucket) under ``hook``
    (a quantization hook's name, or a DDPCommHookType's name to register)."""
    a = api(package)
    a.dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Linear(40, 30, bias=False)
    ddp = a.DDP(model)
    if hasattr(a.hooks.DDPCommHookType, hook):
        a.hooks.register_ddp_comm_hook(getattr(a.hooks.DDPCommHookType, hook), ddp)
    else:
        ddp.register_comm_hook(None, getattr(a.quantization, hook))
    x, _ = batches(rank, 1)[0]
    x = torch.cat([x] * 5, dim=1)
    ddp(x).pow(2).sum().backward()
    _KEEP.append(ddp)
    a.dist.destroy_process_group()
    return model.weight.grad.clone()


def local_grads(rank: int) -> torch.Tensor:
    """The driver's reference for one_bucket_grads: the same backward, no DDP."""
    torch.manual_seed(0)
    model = nn.Linear(40, 30, bias=False)
    x, _ = batches(rank, 1)[0]
    model(torch.cat([x] * 5, dim=1)).pow(2).sum().backward()
    return model.weight.grad.clone()


def powersgd_state_pickle(rank: int, world_size: int, package: str) -> dict[str, Any]:
    """A PowerSGD state after compressing, pickled and restored (its group is dropped)."""
    a = api(package)
    a.dist.init_process_group("gloo")
    model = make_mlp()
    ddp = a.DDP(model)
    state = a.powerSGD.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2)
    ddp.register_comm_hook(state, a.powerSGD.powerSGD_hook)
    for x, y in batches(rank, 3):
        nn.functional.mse_loss(ddp(x), y).backward()
    saved = state.__getstate__()
    restored = pickle.loads(pickle.dumps(state))
    out = {"keys": sorted(saved), "iter": restored.iter,
           "group_is_world": restored.process_group is a.dist.group.WORLD,
           "error_norms": {k: float(v.norm()) for k, v in restored.error_dict.items()},
           "next_seed": int(restored.rng.randint(1_000_000_000))}
    _KEEP.append(ddp)
    a.dist.destroy_process_group()
    return out


def post_local_sgd(rank: int, world_size: int, package: str, wrapper: bool, steps: int
                   ) -> dict[str, Any]:
    """DDP with post_localSGD_hook (pairs of ranks after 2 steps) and a PeriodicModelAverager
    (every 2 steps after 2), stepped through PostLocalSGDOptimizer or by hand."""
    a = api(package)
    warnings.simplefilter("ignore")
    a.dist.init_process_group("gloo")
    subgroup, _ = a.dist.new_subgroups(group_size=2)
    model = make_mlp()
    ddp = a.DDP(model)
    state = a.post_local.PostLocalSGDState(process_group=None, subgroup=subgroup,
                                           start_localSGD_iter=2)
    ddp.register_comm_hook(state, a.post_local.post_localSGD_hook)
    local = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    averager = a.averagers.PeriodicModelAverager(period=2, warmup_steps=2)
    opt = a.optim.PostLocalSGDOptimizer(local, averager) if wrapper else local
    for x, y in batches(rank, steps):
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        if not wrapper:
            averager.average_parameters(model.parameters())
    out: dict[str, Any] = {"params": {k: v.detach().clone()
                                      for k, v in model.state_dict().items()},
                           "hook_iter": state.iter, "averager_step": averager.step}
    if wrapper:
        saved = opt.state_dict()
        out["saved_step"] = saved["step"]
        fresh = a.averagers.PeriodicModelAverager(period=2, warmup_steps=2)
        again = a.optim.PostLocalSGDOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), fresh)
        again.load_state_dict(saved)
        out["restored_step"] = fresh.step
        out["restored_momentum"] = [again.state[p]["momentum_buffer"].clone()
                                    for p in model.parameters()]
    _KEEP.append(ddp)
    a.dist.destroy_process_group()
    return out


def hierarchical(rank: int, world_size: int, package: str, steps: int) -> dict[str, Any]:
    """Each rank trains its own model (no DDP); a HierarchicalModelAverager averages pairs
    every 2 steps and all four every 4, after 1 warm-up step; a PeriodicModelAverager over
    a subgroup and average_parameters over parameter groups as well."""
    a = api(package)
    warnings.simplefilter("ignore")
    a.dist.init_process_group("gloo")
    torch.manual_seed(rank)
    model = nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    averager = a.hierarchical.HierarchicalModelAverager({2: 2, 4: 4}, warmup_steps=1)
    snapshots = []
    for x, y in batches(rank, steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        averager.average_parameters(opt.param_groups)
        snapshots.append([p.detach().clone() for p in model.parameters()])
    evens, odds = a.dist.new_group([0, 2]), a.dist.new_group([1, 3])
    odd_even = odds if rank % 2 else evens
    periodic = a.averagers.PeriodicModelAverager(period=1, warmup_steps=0,
                                                 process_group=odd_even)
    periodic.average_parameters(model.parameters())
    after_periodic = [p.detach().clone() for p in model.parameters()]
    a.utils.average_parameters(iter(model.parameters()), None)
    out = {"snapshots": snapshots, "after_periodic": after_periodic,
           "after_world": [p.detach().clone() for p in model.parameters()]}
    a.dist.destroy_process_group()
    return out


def _message(fn: Any) -> str:
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "warned: " + "; ".join(str(w.message) for w in caught) if caught else "no error"


def error_messages(rank: int, world_size: int, package: str) -> dict[str, str]:
    """The errors (and warnings) of the public constructors and calls, as each API words them."""
    a = api(package)
    a.dist.init_process_group("gloo")
    model = make_mlp()
    periodic = a.averagers.PeriodicModelAverager
    hier = a.hierarchical.HierarchicalModelAverager
    out = {
        "warmup<0": _message(lambda: periodic(period=2, warmup_steps=-1)),
        "period<1": _message(lambda: periodic(period=0)),
        "period=1": _message(lambda: periodic(period=1)),
        "hier-empty": _message(lambda: hier({})),
        "hier-period<=0": _message(lambda: hier({0: 2, 4: world_size})),
        "hier-last-size": _message(lambda: hier({2: 1, 4: world_size + 1})),
        "hier-warmup<0": _message(lambda: hier({2: world_size}, warmup_steps=-1)),
        "hier-max-period-1": _message(lambda: hier({1: world_size})),
        "powersgd-start": _message(lambda: a.powerSGD.PowerSGDState(None,
                                                                    start_powerSGD_iter=1)),
        "params-type": _message(lambda: a.utils.get_params_to_average([torch.zeros(2)])),
        "load-no-step": _message(lambda: a.optim.PostLocalSGDOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), periodic(period=2)).load_state_dict(
                torch.optim.SGD(model.parameters(), lr=0.1).state_dict())),
    }
    ddp = a.DDP(model)
    ddp.register_comm_hook(None, a.default.allreduce_hook)
    out["register-twice"] = _message(lambda: ddp.register_comm_hook(None,
                                                                    a.default.allreduce_hook))
    other = a.DDP(make_mlp())
    other.register_comm_hook(a.post_local.PostLocalSGDState(None, None, start_localSGD_iter=0),
                             a.post_local.post_localSGD_hook)
    x, y = batches(rank, 1)[0]
    out["post-local-no-subgroup"] = _message(
        lambda: nn.functional.mse_loss(other(x), y).backward())
    _KEEP.extend([ddp, other])
    a.dist.destroy_process_group()
    return out


def hook_on_foreign_group(rank: int, world_size: int) -> str:
    """ringtorch only: a hook given a group this rank is not in."""
    a = api("ringtorch")
    a.dist.init_process_group("gloo")
    pair = a.dist.new_group([0, 1])
    ddp = a.DDP(make_mlp())
    ddp.register_comm_hook(pair, a.default.allreduce_hook)
    x, y = batches(rank, 1)[0]
    message = "trained" if rank < 2 else _message(
        lambda: nn.functional.mse_loss(ddp(x), y).backward())
    if rank < 2:
        nn.functional.mse_loss(ddp(x), y).backward()
    _KEEP.append(ddp)
    a.dist.destroy_process_group()
    return message

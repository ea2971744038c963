"""Rank-side code of test_ddp_dropin.py: one program, run under torch (gloo) or ringtorch.

Each function takes ``lib`` ("torch" or "ringtorch"), picks that library's
``distributed`` and ``DistributedDataParallel`` and otherwise runs the same code, so the
driver can hold ringtorch's results to torch's. The functions return what they saw (tensors,
flags, error texts); they check nothing themselves.
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch
from torch import nn

LR = 0.1


def _lib(lib: str) -> tuple[Any, Any]:
    """(distributed module, DistributedDataParallel class) of ``lib``."""
    if lib == "torch":
        import torch.distributed as tdist
        from torch.nn.parallel import DistributedDataParallel as TorchDDP
        return tdist, TorchDDP
    import ringtorch.distributed as rdist
    from ringtorch.nn.parallel import DistributedDataParallel as RingDDP
    return rdist, RingDDP


class TwoBranch(nn.Module):
    """Branch ``a`` is always used; branch ``b`` only where ``use_b`` says."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, use_b: bool = True) -> torch.Tensor:
        return self.a(x) + self.b(x) if use_b else self.a(x)


def make_model() -> TwoBranch:
    """The same initial weights in every process."""
    torch.manual_seed(0)
    return TwoBranch()


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s data for ``step`` (different on every rank and step)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(5, 4, generator=g), torch.randn(5, 3, generator=g)


def _grads(module: nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: None if p.grad is None else p.grad.clone() for n, p in module.named_parameters()}


def _train(ddp: nn.Module, rank: int, steps: range) -> list[dict[str, Any]]:
    """SGD steps on this rank's batches; each step's averaged gradients, then the weights."""
    seen = []
    for step in steps:
        ddp.zero_grad(set_to_none=True)
        x, y = batch(rank, step)
        nn.functional.mse_loss(ddp(x), y).backward()
        seen.append(_grads(ddp.module))
        with torch.no_grad():
            for p in ddp.parameters():
                p -= LR * p.grad
    seen.append({n: p.detach().clone() for n, p in ddp.module.named_parameters()})
    return seen


def _init(dist: Any, rank: int, world_size: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def _finish(dist: Any) -> None:
    """End the job. The caller deletes its DDP modules first: a torch reducer freed after its
    gloo group was destroyed (when the function returns) now and then never returns."""
    dist.barrier()
    dist.destroy_process_group()


def pickle_and_save(rank: int, world_size: int, lib: str, folder: str) -> dict[str, Any]:
    """Train one step, save the whole DDP model to ``folder``, load it back in this job (same
    group), train the copy; also try to pickle a DDP on a group that is not the default."""
    dist, DDP = _lib(lib)
    _init(dist, rank, world_size)
    ddp = DDP(make_model())
    first = _train(ddp, rank, range(1))
    torch.save(ddp, os.path.join(folder, f"{lib}-{rank}.pt"))
    buffer = io.BytesIO()
    torch.save(ddp, buffer)
    buffer.seek(0)
    copy = torch.load(buffer, weights_only=False)
    result: dict[str, Any] = {
        "first": first,
        "copy_is_ddp": type(copy) is DDP and copy is not ddp,
        "copy_on_default_group": copy.process_group is dist.group.WORLD,
        "copy_trained": _train(copy, rank, range(1, 3)),
    }
    other = DDP(make_model(), process_group=dist.new_group(ranks=list(range(world_size))))
    try:
        torch.save(other, io.BytesIO())
        result["other_group_error"] = None
    except RuntimeError as e:
        result["other_group_error"] = str(e)
    del ddp, copy, other
    _finish(dist)
    return result


def load_and_train(rank: int, world_size: int, lib: str, folder: str) -> list[dict[str, Any]]:
    """A new job: load what pickle_and_save saved and train it two more steps."""
    dist, _ = _lib(lib)
    _init(dist, rank, world_size)
    ddp = torch.load(os.path.join(folder, f"{lib}-{rank}.pt"), weights_only=False)
    seen = _train(ddp, rank, range(1, 3))
    del ddp
    _finish(dist)
    return seen


def no_sync_unused(rank: int, world_size: int, lib: str) -> dict[str, Any]:
    """find_unused_parameters=True: rank 1 uses branch b only in two no_sync() steps; then a
    synced step without b; then, gradients cleared, another synced step without b."""
    dist, DDP = _lib(lib)
    _init(dist, rank, world_size)
    ddp = DDP(make_model(), find_unused_parameters=True)
    with ddp.no_sync():
        for step in range(2):
            x, y = batch(rank, step)
            nn.functional.mse_loss(ddp(x, use_b=rank == 1), y).backward()
    local = _grads(ddp.module)
    x, y = batch(rank, 2)
    nn.functional.mse_loss(ddp(x, use_b=False), y).backward()
    synced = _grads(ddp.module)
    ddp.zero_grad(set_to_none=True)
    x, y = batch(rank, 3)
    nn.functional.mse_loss(ddp(x, use_b=False), y).backward()
    after = _grads(ddp.module)
    del ddp
    _finish(dist)
    return {"local": local, "synced": synced, "after": after}


HOOK_SOURCE = '''
def hook(state: list, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    state.append((isinstance(bucket, dist.GradBucket), bucket.index(), bucket.is_last(),
                  [tuple(g.shape) for g in bucket.gradients()],
                  [tuple(p.shape) for p in bucket.parameters()]))
    tensor = bucket.buffer().div_(dist.get_world_size())
    bucket.set_buffer(tensor)
    fut = dist.all_reduce(tensor, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0] if isinstance(f.value(), list) else f.value())
'''


def hook_annotated_with_grad_bucket(rank: int, world_size: int, lib: str) -> dict[str, Any]:
    """Define a comm hook annotated with ``dist.GradBucket`` (evaluated at definition, as in a
    module without ``from __future__ import annotations``), register it and train."""
    dist, DDP = _lib(lib)
    _init(dist, rank, world_size)
    namespace: dict[str, Any] = {"dist": dist, "torch": torch}
    # compiled without this module's `from __future__ import annotations`: the annotations
    # are evaluated when the hook is defined, as in a module without that import
    exec(compile(HOOK_SOURCE, "<hook>", "exec", dont_inherit=True), namespace)
    calls: list[Any] = []
    ddp = DDP(make_model())
    ddp.register_comm_hook(calls, namespace["hook"])
    seen = _train(ddp, rank, range(2))
    del ddp
    _finish(dist)
    return {"calls": calls, "seen": seen}

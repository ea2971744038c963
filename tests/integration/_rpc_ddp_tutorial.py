"""torch's tutorial "Combining Distributed DataParallel with Distributed RPC Framework", as one
program written against whichever library it is given (``"torch"`` or ``"ringtorch"``).

World 4, as the tutorial: ranks 0 and 1 are trainers, rank 2 the master, rank 3 the parameter
server. The master builds an EmbeddingBag on the parameter server through RemoteModule and
sends the RemoteModule to both trainers; each trainer wraps a local Linear in DDP over a
process group of the two trainers only, and steps the remote embedding and its Linear with a
DistributedOptimizer inside a distributed autograd context. Three changes make the run
reproducible, so that it can be compared: the batches and initial weights are seeded; the
trainers meet at a barrier after each step (so each forward sees both trainers' updates of
the embedding, in whichever order the parameter server applied them); and the optimizer is
a subclass of SGD. torch steps ``torch.optim.SGD`` itself through its TorchScript form with
no lock, so the two trainers' steps on the embedding can overlap and lose part of an update
(seen under load: 125 of the 1,600 embedding values off by up to 4e-3); a subclass takes
torch's locked path, which ringtorch takes for every optimizer.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from typing import Any

import torch

NUM_EMBEDDINGS = 100
EMBEDDING_DIM = 16
BATCHES = 4   # per epoch, the same each epoch, so the loss can be seen to fall
EPOCHS = 3


class SeededEmbeddingBag(torch.nn.EmbeddingBag):
    def __init__(self, num: int, dim: int, *, mode: str) -> None:
        torch.manual_seed(0)
        super().__init__(num, dim, mode=mode)


class LockedSGD(torch.optim.SGD):
    """SGD outside torch's map of functional optimizers, so torch steps it under its lock."""


def seeded_linear() -> torch.nn.Linear:
    torch.manual_seed(1)
    return torch.nn.Linear(EMBEDDING_DIM, 8)


def batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The tutorial's random bags of indices, drawn from a generator seeded by the rank."""
    gen = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(BATCHES):
        num_indices = int(torch.randint(20, 50, (1,), generator=gen))
        indices = torch.randint(0, NUM_EMBEDDINGS, (num_indices,), generator=gen)
        offsets, start = [], 0
        while start < num_indices:
            offsets.append(start)
            start += int(torch.randint(1, 10, (1,), generator=gen))
        target = torch.randint(0, 8, (len(offsets),), generator=gen)
        out.append((indices, torch.tensor(offsets), target))
    return out


class HybridModel(torch.nn.Module):
    """The remote embedding, then a local Linear under DDP."""

    def __init__(self, remote_emb_module: Any, ddp: Any) -> None:
        super().__init__()
        self.remote_emb_module = remote_emb_module
        self.fc = ddp(seeded_linear())

    def forward(self, indices: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        emb_lookup = self.remote_emb_module.forward(indices, offsets)
        return self.fc(emb_lookup)


def _libs(library: str) -> dict[str, Any]:
    names = {"dist": "distributed", "rpc": "distributed.rpc",
             "dist_autograd": "distributed.autograd", "optim": "distributed.optim",
             "nn": "distributed.nn", "parallel": "nn.parallel"}
    return {k: importlib.import_module(f"{library}.{v}") for k, v in names.items()}


def run_trainer(remote_emb_module: Any, rank: int, library: str) -> dict[str, Any]:
    lib = _libs(library)
    model = HybridModel(remote_emb_module, lib["parallel"].DistributedDataParallel)
    model_parameter_rrefs = model.remote_emb_module.remote_parameters()
    for param in model.fc.parameters():
        model_parameter_rrefs.append(lib["rpc"].RRef(param))
    opt = lib["optim"].DistributedOptimizer(LockedSGD, model_parameter_rrefs, lr=0.05)
    criterion = torch.nn.CrossEntropyLoss()
    losses = []
    for indices, offsets, target in batches(rank) * EPOCHS:
        with lib["dist_autograd"].context() as context_id:
            output = model(indices, offsets)
            loss = criterion(output, target)
            lib["dist_autograd"].backward(context_id, [loss])
            if not losses:  # gradients go to the context, never to .grad
                grads_after_backward = [p.grad for p in model.fc.parameters()]
            opt.step(context_id)
        lib["dist"].barrier()
        losses.append(float(loss))
    return {"losses": losses, "fc": [p.detach().clone() for p in model.fc.parameters()],
            "grads_after_backward": grads_after_backward}


def _wait_both(futs: list[Any]) -> list[Any]:
    """Both trainers' results; the first error as soon as it is known (a trainer that failed
    leaves the other waiting in DDP's all_reduce, which would hide the failure)."""
    done = threading.Event()
    for fut in futs:
        fut.add_done_callback(lambda _: done.set())
    while not all(fut.done() for fut in futs):
        done.wait()
        done.clear()
        for fut in futs:
            if fut.done():
                fut.wait()  # raises the trainer's error
    return [fut.wait() for fut in futs]


def run_worker(rank: int, world_size: int, library: str, pg_port: int) -> dict[str, Any]:
    warnings.simplefilter("ignore")
    lib = _libs(library)
    rpc = lib["rpc"]
    # generous: run_trainer is one call that lasts the whole training (seconds; more under load)
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=8, rpc_timeout=150)
    out: dict[str, Any] = {}
    if rank == 2:
        rpc.init_rpc("master", rank=rank, world_size=world_size, rpc_backend_options=options)
        remote_emb_module = lib["nn"].RemoteModule(
            "ps", SeededEmbeddingBag, args=(NUM_EMBEDDINGS, EMBEDDING_DIM),
            kwargs={"mode": "sum"})
        futs = [rpc.rpc_async(f"trainer{r}", run_trainer, args=(remote_emb_module, r, library))
                for r in (0, 1)]
        out["trainers"] = _wait_both(futs)
        out["embedding"] = [p.to_here() for p in remote_emb_module.remote_parameters()]
    elif rank <= 1:
        lib["dist"].init_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{pg_port}",
                                       rank=rank, world_size=2)
        rpc.init_rpc(f"trainer{rank}", rank=rank, world_size=world_size,
                     rpc_backend_options=options)
    else:
        rpc.init_rpc("ps", rank=rank, world_size=world_size, rpc_backend_options=options)
    rpc.shutdown()
    if rank <= 1:
        lib["dist"].destroy_process_group()
    return out


def reference() -> dict[str, Any]:
    """The same training in one process with plain torch: each step, both trainers' forwards
    with the current weights; the Linear steps with the mean of their gradients (DDP), the
    embedding with each trainer's gradient (one DistributedOptimizer step each)."""
    emb = SeededEmbeddingBag(NUM_EMBEDDINGS, EMBEDDING_DIM, mode="sum")
    fc = seeded_linear()
    criterion = torch.nn.CrossEntropyLoss()
    data = [batches(0) * EPOCHS, batches(1) * EPOCHS]
    losses: list[list[float]] = [[], []]
    for step in range(BATCHES * EPOCHS):
        emb_grad = torch.zeros_like(emb.weight)
        fc_grads = [torch.zeros_like(p) for p in fc.parameters()]
        for rank in (0, 1):
            indices, offsets, target = data[rank][step]
            loss = criterion(fc(emb(indices, offsets)), target)
            g_emb, *g_fc = torch.autograd.grad(loss, [emb.weight, *fc.parameters()])
            emb_grad += g_emb
            fc_grads = [a + b / 2 for a, b in zip(fc_grads, g_fc, strict=True)]
            losses[rank].append(loss.item())
        with torch.no_grad():
            emb.weight -= 0.05 * emb_grad
            for p, g in zip(fc.parameters(), fc_grads, strict=True):
                p -= 0.05 * g
    return {"losses": losses, "fc": [p.detach() for p in fc.parameters()],
            "embedding": [emb.weight.detach()]}

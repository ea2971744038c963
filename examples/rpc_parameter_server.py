"""A parameter server over RPC: one worker holds the model, the trainers send it gradients.

    ringrun --nproc-per-node 3 examples/rpc_parameter_server.py [--steps 60]

Rank 0 is the parameter server ("ps"), every other rank a trainer. Each trainer makes an
RRef to the server's model with ``rpc.remote`` (as seed 004 does with its embedding table),
fetches the weights through the RRef, computes the gradient of its own data shard and sends
it with ``ps.rpc_sync().update_and_fetch(grads)``. That method is an ``@async_execution``
method: each call returns at once with a Future, the server averages one gradient from every
trainer, takes an SGD step and completes the Future with the new weights, which answers every
trainer at once (synchronous data-parallel SGD, without a process group).

The only ringtorch-specific line is the import: with ``import torch.distributed.rpc as rpc``
the script runs on torch unchanged (it uses ``torch.futures.Future``, which ringtorch's RPC
accepts wherever torch's does).
"""

from __future__ import annotations

import argparse
import os
import threading

import torch

import ringtorch.distributed.rpc as rpc

FEATURES = 8
TRUE_WEIGHT = torch.linspace(-1.0, 1.0, FEATURES)
TRUE_BIAS = 0.5


class ParameterServer:
    """The model, and the batch of gradients of the current step."""

    def __init__(self, num_trainers: int, lr: float) -> None:
        self.model = torch.nn.Linear(FEATURES, 1)
        self.num_trainers = num_trainers
        self.lr = lr
        self.lock = threading.Lock()
        self.grads: list[torch.Tensor] | None = None
        self.arrived = 0
        self.step = 0
        self.future: torch.futures.Future = torch.futures.Future()

    def get_weights(self) -> list[torch.Tensor]:
        with self.lock:
            return [p.detach().clone() for p in self.model.parameters()]

    @rpc.functions.async_execution
    def update_and_fetch(self, grads: list[torch.Tensor]) -> torch.futures.Future:
        """Add one trainer's gradients; the Future completes with the weights after the step."""
        with self.lock:
            if self.grads is None:
                self.grads = [g.clone() for g in grads]
            else:
                for acc, g in zip(self.grads, grads, strict=True):
                    acc += g
            self.arrived += 1
            future = self.future
            if self.arrived < self.num_trainers:
                return future
            with torch.no_grad():
                for param, acc in zip(self.model.parameters(), self.grads, strict=True):
                    param -= self.lr * acc / self.num_trainers
            self.grads, self.arrived = None, 0
            self.step += 1
            self.future = torch.futures.Future()
            weights = [p.detach().clone() for p in self.model.parameters()]
        future.set_result(weights)
        return future


_server: ParameterServer | None = None
_server_lock = threading.Lock()


def get_parameter_server(num_trainers: int, lr: float) -> ParameterServer:
    """The server's one ParameterServer (every trainer's ``rpc.remote`` gets an RRef to it)."""
    global _server
    with _server_lock:
        if _server is None:
            _server = ParameterServer(num_trainers, lr)
        return _server


def shard(rank: int, n: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """This trainer's data: y = x . TRUE_WEIGHT + TRUE_BIAS + noise."""
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(n, FEATURES, generator=gen)
    y = x @ TRUE_WEIGHT + TRUE_BIAS + 0.01 * torch.randn(n, generator=gen)
    return x, y.unsqueeze(1)


def train(rank: int, world_size: int, steps: int, lr: float) -> None:
    ps = rpc.remote("ps", get_parameter_server, args=(world_size - 1, lr))
    x, y = shard(rank)
    model = torch.nn.Linear(FEATURES, 1)
    weights = ps.rpc_sync().get_weights()
    losses = []
    for _ in range(steps):
        with torch.no_grad():
            for param, value in zip(model.parameters(), weights, strict=True):
                param.copy_(value)
        model.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        losses.append(loss.item())
        weights = ps.rpc_sync().update_and_fetch([p.grad for p in model.parameters()])
    # one write per line: ringrun starts workers with `python -u` (as torchrun does), where
    # print() writes the text and its newline separately and the three ranks' lines would mix
    print(f"trainer{rank}: loss {losses[0]:.4f} -> {losses[-1]:.4f} after {steps} steps\n",
          end="", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=0.2)
    args = parser.parse_args()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world_size < 2:
        raise SystemExit("run at least 2 processes: one parameter server and one trainer")
    name = "ps" if rank == 0 else f"trainer{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world_size)
    if rank != 0:
        train(rank, world_size, args.steps, args.lr)
    rpc.shutdown()  # the server waits here until every trainer is done
    if rank == 0 and _server is not None:
        weight, bias = (p.detach() for p in _server.model.parameters())
        error = (weight.flatten() - TRUE_WEIGHT).abs().max().item()
        print(f"ps: {_server.step} steps, max weight error {error:.4f}, "
              f"bias {bias.item():.4f} (true {TRUE_BIAS})\n", end="", flush=True)


if __name__ == "__main__":
    main()

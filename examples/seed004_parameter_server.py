"""Seed 004: an RNN word-language model split between a parameter server and a trainer.

    python examples/seed004_parameter_server.py [--steps 40] [--backend ringtorch|torch]
    ringrun --nproc-per-node 2 examples/seed004_parameter_server.py

Rank 0 is the parameter server ("ps"): it holds the EmbeddingTable and the Decoder, created
by the trainer with ``rpc.remote``. Rank 1 is the trainer: it owns the LSTM, runs the forward
through both remote modules with ``rpc_sync``, the backward with ``dist_autograd.backward`` and
the update with ``DistributedOptimizer.step`` (SGD on both workers), as in torch's RPC
tutorial. The corpus is made here: sentences from a tiny grammar, so the loss has something
to learn. ``--backend torch`` runs the same program on ``torch.distributed.rpc`` (the
benchmark compares the two); without ringrun the script starts both workers with that
system's ``multiprocessing.spawn``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import random
import time
from typing import Any

import torch
from torch import nn

BACKENDS = {"ringtorch": "ringtorch.distributed", "torch": "torch.distributed"}
SPAWNERS = {"ringtorch": "ringtorch.multiprocessing", "torch": "torch.multiprocessing"}
rpc: Any = None
dist_autograd: Any = None
DistributedOptimizer: Any = None


def use_backend(name: str) -> None:
    """Bind ``rpc``, ``dist_autograd`` and ``DistributedOptimizer`` to one implementation."""
    global rpc, dist_autograd, DistributedOptimizer
    base = BACKENDS[name]
    rpc = importlib.import_module(base + ".rpc")
    dist_autograd = importlib.import_module(base + ".autograd")
    DistributedOptimizer = importlib.import_module(base + ".optim").DistributedOptimizer


def _generator(seed: int) -> torch.Generator:
    """A generator of the module's own: the parameter server builds the trainer's modules
    at the same time (each ``rpc.remote`` on a thread of its pool, under torch as here), so
    weights drawn from torch's global generator, even right after ``torch.manual_seed``,
    would depend on how the two constructions interleave."""
    return torch.Generator().manual_seed(seed)


class EmbeddingTable(nn.Module):
    """Encoding layer of the RNN model (lives on the parameter server)."""

    def __init__(self, ntoken: int, ninp: int, dropout: float, seed: int) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.encoder.weight.data.uniform_(-0.1, 0.1, generator=_generator(seed))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.drop(self.encoder(input))


class Decoder(nn.Module):
    """Decoding layer of the RNN model (lives on the parameter server)."""

    def __init__(self, ntoken: int, nhid: int, dropout: float, seed: int) -> None:
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.decoder.bias.data.zero_()
        self.decoder.weight.data.uniform_(-0.1, 0.1, generator=_generator(seed))

    def forward(self, output: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.drop(output))


def _call_method(method: Any, rref: Any, *args: Any) -> Any:
    return method(rref.local_value(), *args)


def _remote_method(method: Any, rref: Any, *args: Any) -> Any:
    return rpc.rpc_sync(rref.owner(), _call_method, args=(method, rref) + args)


def _parameter_rrefs(module: nn.Module) -> list[Any]:
    return [rpc.RRef(p) for p in module.parameters()]


class RNNModel(nn.Module):
    """Embedding and decoder on ``ps`` (RRefs), the LSTM here."""

    def __init__(self, ps: str, ntoken: int, ninp: int, nhid: int, nlayers: int,
                 dropout: float = 0.0, seed: int = 0) -> None:
        super().__init__()
        self.emb_table_rref = rpc.remote(ps, EmbeddingTable, args=(ntoken, ninp, dropout, seed))
        torch.manual_seed(seed + 1)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder_rref = rpc.remote(ps, Decoder, args=(ntoken, nhid, dropout, seed + 2))

    def forward(self, input: torch.Tensor, hidden: Any) -> tuple[torch.Tensor, Any]:
        emb = _remote_method(EmbeddingTable.forward, self.emb_table_rref, input)
        output, hidden = self.rnn(emb, hidden)
        decoded = _remote_method(Decoder.forward, self.decoder_rref, output)
        return decoded, hidden

    def parameter_rrefs(self) -> list[Any]:
        remote_params = []
        remote_params.extend(_remote_method(_parameter_rrefs, self.emb_table_rref))
        remote_params.extend(_parameter_rrefs(self.rnn))
        remote_params.extend(_remote_method(_parameter_rrefs, self.decoder_rref))
        return remote_params


# ---- the corpus -------------------------------------------------------------------------

SUBJECTS = ["the cat", "a dog", "the old man", "my friend", "the bird"]
VERBS = ["sees", "likes", "follows", "hears", "finds"]
OBJECTS = ["the ball", "a tree", "the river", "the house", "a small fish"]


def make_corpus(sentences: int = 400, seed: int = 4) -> tuple[torch.Tensor, int]:
    """Token ids of a generated text, and the vocabulary size."""
    rng = random.Random(seed)
    words: list[str] = []
    for _ in range(sentences):
        words += f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} .".split()
    vocab = {w: i for i, w in enumerate(sorted(set(words)))}
    return torch.tensor([vocab[w] for w in words]), len(vocab)


def batches(ids: torch.Tensor, batch: int, bptt: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, target) pairs of shape (bptt, batch) and (bptt * batch,), as the tutorial."""
    n = ids.numel() // batch
    data = ids[: n * batch].view(batch, n).t().contiguous()
    return [(data[i:i + bptt], data[i + 1:i + 1 + bptt].reshape(-1))
            for i in range(0, n - 1 - bptt, bptt)]


def init_hidden(nlayers: int, batch: int, nhid: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(nlayers, batch, nhid), torch.zeros(nlayers, batch, nhid)


LR = 2.0
CONFIG = {"ninp": 32, "nhid": 32, "nlayers": 2, "batch": 8, "bptt": 12}


def train(steps: int) -> tuple[float, float, float]:
    """(mean of the first 5 losses, of the last 5, steps per second after 3 warm-up steps)."""
    ids, ntoken = make_corpus()
    c = CONFIG
    model = RNNModel("ps", ntoken, c["ninp"], c["nhid"], c["nlayers"])
    opt = DistributedOptimizer(torch.optim.SGD, model.parameter_rrefs(), lr=LR)
    criterion = nn.CrossEntropyLoss()
    data = batches(ids, c["batch"], c["bptt"])
    losses = []
    warmup = min(3, steps - 1)  # the first steps pay one-time costs (lazy imports, threads)
    started = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            started = time.perf_counter()
        input, target = data[step % len(data)]
        hidden = init_hidden(c["nlayers"], c["batch"], c["nhid"])
        with dist_autograd.context() as context_id:
            output, _ = model(input, hidden)
            loss = criterion(output.view(-1, ntoken), target)
            dist_autograd.backward(context_id, [loss])
            opt.step(context_id)
        losses.append(loss.item())
    elapsed = time.perf_counter() - started
    first, last = losses[:5], losses[-5:]
    return sum(first) / len(first), sum(last) / len(last), (steps - warmup) / elapsed


def run_worker(rank: int, world_size: int, steps: int,
               backend: str) -> tuple[float, float, float] | None:
    """Serve (rank 0) or train (rank 1); the trainer returns ``train``'s result."""
    use_backend(backend)
    name = "ps" if rank == 0 else "trainer"
    rpc.init_rpc(name, rank=rank, world_size=world_size)
    result = None
    if rank == 1:
        result = train(steps)
        first, last, rate = result
        print(f"trainer: loss {first:.3f} -> {last:.3f} after {steps} steps, "
              f"{rate:.1f} steps/s ({backend})", flush=True)
    rpc.shutdown()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--backend", choices=sorted(BACKENDS), default="ringtorch")
    args = parser.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        run_worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args.steps,
                   args.backend)
        return
    import socket

    mp = importlib.import_module(SPAWNERS[args.backend])  # each system starts its own workers
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(port))
    mp.spawn(run_worker, args=(2, args.steps, args.backend), nprocs=2, join=True)


if __name__ == "__main__":
    main()

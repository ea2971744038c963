"""FSDP2 training with checkpoint and resume, on CPU through backend "ringtorch".

Follows pytorch/examples' distributed/FSDP2 program (example.py with its model.py and
checkpoint.py): a toy transformer built on the meta device, ``fully_shard`` on each block and
then the root, optional bf16 mixed precision and explicit prefetching, Adam with gradient
clipping, and a full (unsharded) checkpoint of model and optimizer written by rank 0 and read
back on the next run, through torch's DTensor calls or through
``torch.distributed.checkpoint.state_dict`` (``--dcp-api``). Written anew here; what differs
from the original, all because it runs on CPU or in a test:

* the device is the CPU: the original stops unless two accelerators are present, and picks its
  backend from the device (gloo on CPU); here the group is ``init_process_group("ringtorch")``
  (``--backend`` says another, such as gloo, to compare);
* small sizes (2 blocks of width 16, vocabulary 64, batch 4 of 16 tokens) and 3 steps a run
  instead of 10 blocks, vocabulary 1024, batch 32 of 64 and 10 steps;
* no dropout (the original sets 0 too), the checkpoint folder is ``--checkpoint-dir``, and
  rank 0 prints each step's loss and what it saved or loaded, which the test reads.

    ringrun --nproc-per-node 2 examples/modern/fsdp2_example.py --checkpoint-dir /tmp/ck
    torchrun --nproc-per-node 2 examples/modern/fsdp2_example.py --mixed-precision
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor


@dataclass
class Config:
    layers: int = 2
    dim: int = 16
    heads: int = 4
    vocab: int = 64
    seq: int = 16


class Block(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.heads = c.heads
        self.norm1, self.norm2 = nn.LayerNorm(c.dim), nn.LayerNorm(c.dim)
        self.qkv = nn.Linear(c.dim, 3 * c.dim, bias=False)
        self.proj = nn.Linear(c.dim, c.dim, bias=False)
        self.up, self.down = nn.Linear(c.dim, 4 * c.dim), nn.Linear(4 * c.dim, c.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(self.norm1(x)).chunk(3, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(a)
        return x + self.down(F.gelu(self.up(self.norm2(x))))

    def reset_parameters(self) -> None:
        for m in (self.norm1, self.norm2, self.qkv, self.proj, self.up, self.down):
            m.reset_parameters()


class Transformer(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.dim)
        self.pos = nn.Embedding(c.seq, c.dim)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = nn.LayerNorm(c.dim)
        self.out = nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))
        for layer in self.layers:
            h = layer(h)
        return self.out(self.norm(h)).float()

    def reset_parameters(self) -> None:
        for m in (self.tok, self.pos, self.norm, self.out):
            m.reset_parameters()
        for layer in self.layers:
            layer.reset_parameters()


def latest(folder: str) -> str | None:
    runs = [int(n) for n in os.listdir(folder) if n.isdigit()] if os.path.isdir(folder) else []
    return os.path.join(folder, str(max(runs))) if runs else None


def load(model: nn.Module, opt: torch.optim.Optimizer, path: str, dcp_api: bool) -> None:
    """Each rank reads the full state and keeps its shards."""
    msd = torch.load(os.path.join(path, "model.pt"), mmap=True, weights_only=True)
    osd = torch.load(os.path.join(path, "optim.pt"), mmap=True, weights_only=True)
    if dcp_api:
        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, msd, options=opts)
        set_optimizer_state_dict(model, opt, osd, options=opts)
        return
    live = model.state_dict()
    model.load_state_dict({k: nn.Parameter(distribute_tensor(v, live[k].device_mesh,
                                                             live[k].placements))
                           for k, v in msd.items()}, assign=True)
    # the optimizer state: torch's loader of a full optimizer state dict
    set_optimizer_state_dict(model, opt, osd, options=StateDictOptions(full_state_dict=True))


def save(model: nn.Module, opt: torch.optim.Optimizer, folder: str, dcp_api: bool) -> str:
    """Rank 0 writes the full (unsharded) model and optimizer state."""
    if dcp_api:
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        msd = get_model_state_dict(model, options=opts)
    else:
        msd = {k: v.full_tensor() for k, v in model.state_dict().items()}
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    osd = get_optimizer_state_dict(model, opt, options=opts)
    path = os.path.join(folder, str(time.time_ns()))
    if dist.get_rank() == 0:
        os.makedirs(path)
        torch.save(msd, os.path.join(path, "model.pt"))
        torch.save(osd, os.path.join(path, "optim.pt"))
    return path


def main(args: argparse.Namespace) -> None:
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    c = Config()
    with torch.device("meta"):
        model = Transformer(c)
    kw = {}
    if args.mixed_precision:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    if args.explicit_prefetching:
        blocks = list(model.layers)
        for i, block in enumerate(blocks[:-1]):
            block.set_modules_to_forward_prefetch([blocks[i + 1]])
        for i, block in enumerate(blocks[1:], 1):
            block.set_modules_to_backward_prefetch([blocks[i - 1]])
    model.to_empty(device="cpu")
    previous = latest(args.checkpoint_dir)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    if previous is None:
        model.reset_parameters()
    else:
        load(model, opt, previous, args.dcp_api)
        if rank == 0:
            print(f"resumed from {previous}")
    gen = torch.Generator().manual_seed(1 + (previous is not None))
    for step in range(args.steps):
        if args.explicit_prefetching:
            model.unshard()
        x = torch.randint(0, c.vocab, (4, c.seq), generator=gen)
        loss = model(x).sum()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        opt.zero_grad()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}")
    path = save(model, opt, args.checkpoint_dir, args.dcp_api)
    if rank == 0:
        print(f"saved {path} on {dist.get_backend()}")
    # A barrier before the end, as torch's tutorials do. Without it the same program on gloo
    # (the comparison run) aborted at exit in 4 of 30 runs here ("terminate called without an
    # active exception"): gloo's worker thread releases the last collective's tensors after
    # the caller has its result, and must take the GIL to do so; when the interpreter is
    # already finalizing, Python ends that thread inside a C++ destructor. The barrier's wait
    # gives the GIL up, so the worker is done before the exit (0 aborts in 40 runs).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="FSDP2 on CPU")
    parser.add_argument("--backend", default="ringtorch")
    parser.add_argument("--explicit-prefetching", action="store_true")
    parser.add_argument("--mixed-precision", action="store_true")
    parser.add_argument("--dcp-api", action="store_true")
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--steps", type=int, default=3)
    main(parser.parse_args())

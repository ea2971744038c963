"""Pipeline parallelism of a GPT-style transformer on CPU through backend "ringtorch".

Follows the program of PyTorch's tutorial "Introduction to Distributed Pipeline
Parallelism" (pytorch/tutorials, intermediate_source/pipelining_tutorial.rst): a transformer
of ``nn.TransformerDecoderLayer`` blocks in a ModuleDict, cut in half by hand (stage 0 keeps
the embedding and the first half of the blocks, stage 1 the rest, the norm and the output
layer) or by torch's tracer (``pipeline`` with a ``SplitPoint``, ``--tracer``), run with
``ScheduleGPipe`` over 4 microbatches of a token-wise cross-entropy loss; the last stage
prints the microbatches' losses. Written anew here; what differs from the tutorial, all
because it runs on CPU or in a test:

* the group is ``init_process_group("ringtorch")`` (the tutorial's default is gloo on CPU;
  ``--backend`` says another);
* small sizes: width 64, 4 blocks of 4 heads, vocabulary 500, batch 8 of 16 tokens (the
  tutorial: 512, 8 blocks of 8 heads, 10000, 32 of 500);
* ``--schedule 1f1b`` runs ``Schedule1F1B`` instead, ``--dropout`` sets the blocks' dropout
  (the tutorial keeps torch's default, 0.1; the test sets 0 to compare with one process), and
  the input is seeded random tokens instead of ones, so that the loss depends on the input.

    ringrun --nproc-per-node 2 examples/modern/pipelining_tutorial.py
    torchrun --nproc-per-node 2 examples/modern/pipelining_tutorial.py --schedule 1f1b
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    SplitPoint,
    pipeline,
)

MICROBATCHES = 4


@dataclass
class ModelArgs:
    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    vocab_size: int = 500
    dropout: float = 0.1


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        # a ModuleDict: deleting the other stage's blocks keeps the names of the rest
        self.layers = nn.ModuleDict({str(i): nn.TransformerDecoderLayer(
            args.dim, args.n_heads, dropout=args.dropout) for i in range(args.n_layers)})
        self.norm = nn.LayerNorm(args.dim)
        self.output = nn.Linear(args.dim, args.vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # a part set to None is skipped: that is how a stage drops what it does not run
        h = self.tok_embeddings(tokens) if self.tok_embeddings else tokens
        for layer in self.layers.values():
            h = layer(h, h)
        h = self.norm(h) if self.norm else h
        return self.output(h).clone() if self.output else h


def data(args: ModelArgs) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return (torch.randint(0, args.vocab_size, (8, 16), generator=gen),
            torch.randint(0, args.vocab_size, (8, 16), generator=gen))


def make_model(args: ModelArgs) -> Transformer:
    torch.manual_seed(0)
    return Transformer(args)


def tokenwise_loss(args: ModelArgs) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(outputs.reshape(-1, args.vocab_size),
                                           targets.reshape(-1))
    return loss


def manual_split(model: Transformer, stage: int, stages: int) -> PipelineStage:
    half = len(model.layers) // 2
    for i in (range(half, len(model.layers)) if stage == 0 else range(half)):
        del model.layers[str(i)]
    if stage == 0:
        model.norm = None
        model.output = None
    else:
        model.tok_embeddings = None
    return PipelineStage(model, stage, stages, torch.device("cpu"))


def tracer_split(model: Transformer, example: torch.Tensor, stage: int,
                 group: dist.ProcessGroup) -> PipelineStage:
    pipe = pipeline(model, mb_args=(example,),
                    split_spec={f"layers.{len(model.layers) // 2}": SplitPoint.BEGINNING})
    return pipe.build_stage(stage, torch.device("cpu"), group)


def main(cli: argparse.Namespace) -> None:
    dist.init_process_group(cli.backend)
    rank, stages = dist.get_rank(), dist.get_world_size()
    pp_group = dist.new_group()  # a sub-group in an N-D job
    args = ModelArgs(dropout=cli.dropout)
    model = make_model(args)
    x, y = data(args)
    if cli.tracer:
        stage = tracer_split(model, x.chunk(MICROBATCHES)[0], rank, pp_group)
    else:
        stage = manual_split(model, rank, stages)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[cli.schedule]
    schedule = kind(stage, n_microbatches=MICROBATCHES, loss_fn=tokenwise_loss(args))
    if rank == 0:
        schedule.step(x)
    elif rank == stages - 1:
        losses: list[torch.Tensor] = []
        schedule.step(target=y, losses=losses)
        print(f"losses: {[round(loss.item(), 6) for loss in losses]} on {dist.get_backend()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="pipeline parallelism on CPU")
    parser.add_argument("--backend", default="ringtorch")
    parser.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
    parser.add_argument("--tracer", action="store_true", help="split with torch's tracer")
    parser.add_argument("--dropout", type=float, default=0.1)
    main(parser.parse_args())

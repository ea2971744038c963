"""Train a small CNN on scikit-learn's handwritten digits with ringtorch's DDP on every rank.

The dataset ships inside scikit-learn (1,797 8x8 images of the digits 0-9), so nothing is
downloaded. Each rank reads its share of the training set through DistributedSampler; DDP
averages the gradients; rank 0 shows a progress bar, prints loss and accuracy per epoch
(reduced over all ranks) and writes a checkpoint that ``--resume`` continues from.

    pip install -e '.[examples]'
    ringrun --nproc-per-node 2 examples/train.py               # 12 epochs, about 98% test accuracy
    ringrun --nproc-per-node 2 examples/train.py --epochs 15 --resume   # 3 more epochs

The same script runs under torchrun with ``--torch`` (torch.distributed and torch's DDP), which
is how the two can be compared.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12, help="train until this epoch count")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints/digits.pt"))
    parser.add_argument("--resume", action="store_true",
                        help="continue from --checkpoint if it exists")
    parser.add_argument("--torch", action="store_true",
                        help="use torch.distributed and torch's DDP instead of ringtorch's")
    return parser.parse_args(argv)


def load_digits_split(seed: int) -> tuple[TensorDataset, TensorDataset]:
    """80/20 split of scikit-learn's digits, pixels scaled to [0, 1], shaped (N, 1, 8, 8)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32).div_(16.0).view(-1, 1, 8, 8)
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed,
                                                        stratify=y)
    return TensorDataset(x_train, y_train), TensorDataset(x_test, y_test)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def summed(dist: Any, values: list[float]) -> list[float]:
    """Sum per-rank counters over all ranks."""
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def evaluate(dist: Any, model: nn.Module, data: TensorDataset) -> tuple[float, float]:
    """Test loss and accuracy over the whole set: each rank scores every world_size-th sample."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = data.tensors[0][rank::world], data.tensors[1][rank::world]
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y, reduction="sum").item()
        correct = (logits.argmax(1) == y).sum().item()
    model.train()
    loss, correct, count = summed(dist, [loss, correct, len(y)])
    return loss / count, correct / count


def save_checkpoint(path: Path, epoch: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """Rank 0 only; written to a temporary file first, so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": opt.state_dict()}, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    if args.torch:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DistributedSampler
    else:
        from ringtorch import distributed as dist
        from ringtorch.nn.parallel import DistributedDataParallel as DDP
        from ringtorch.utils.data import DistributedSampler
    from tqdm import tqdm

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    torch.manual_seed(args.seed)

    train_set, test_set = load_digits_split(args.seed)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start_epoch = 0
    if args.resume and args.checkpoint.exists():
        state = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
        if rank == 0:
            print(f"resuming from {args.checkpoint} at epoch {start_epoch + 1}", flush=True)
    ddp = DDP(model)
    sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    started = time.perf_counter()
    test_acc = evaluate(dist, model, test_set)[1]
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        loss_sum = correct = count = 0.0
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{args.epochs}", disable=rank != 0,
                   leave=False, unit="batch")
        for x, y in bar:
            opt.zero_grad()
            logits = ddp(x)
            loss = nn.functional.cross_entropy(logits, y)
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
            count += len(y)
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
        loss_sum, correct, count = summed(dist, [loss_sum, correct, count])
        test_loss, test_acc = evaluate(dist, model, test_set)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: train loss {loss_sum / count:.4f} "
                  f"acc {correct / count:.2%} | test loss {test_loss:.4f} acc {test_acc:.2%}",
                  flush=True)
            save_checkpoint(args.checkpoint, epoch, model, opt)
    if rank == 0:
        print(f"final test accuracy {test_acc:.2%} on {len(test_set)} images; {world} ranks, "
              f"{time.perf_counter() - started:.1f} s; checkpoint {args.checkpoint}", flush=True)
    dist.destroy_process_group()
    return test_acc


if __name__ == "__main__":
    main()

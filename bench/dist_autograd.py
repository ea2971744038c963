"""Seed 004's training step: ringtorch vs torch.distributed.rpc + autograd, side by side.

Each round runs examples/seed004_parameter_server.py twice, once per system, as its own
2-process job started with spawn (a parameter server with the EmbeddingTable and Decoder, a
trainer with the LSTM; forward over two RPCs, ``dist_autograd.backward``,
``DistributedOptimizer.step`` with SGD). The script reports steps per second after 3 warm-up
steps (the first steps pay one-time costs: torch.optim's lazy imports, thread pools). Rounds
alternate the order of the two systems so that the machine's noise hits both alike. The table
shows the median steps/s of each system over the rounds and the ratio ringtorch / torch
(above 1: ringtorch is faster); it also checks that both systems reach the same losses.

    .venv/bin/python bench/dist_autograd.py
    .venv/bin/python bench/dist_autograd.py --rounds 5 --steps 300
    .venv/bin/python bench/dist_autograd.py --json bench/out/autograd.json   # bench/_report.py's
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from pathlib import Path

from _report import Recorder  # bench/ is sys.path[0]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "seed004_parameter_server.py"
LINE = re.compile(r"trainer: loss ([\d.]+) -> ([\d.]+) after \d+ steps, ([\d.]+) steps/s")


def run_once(backend: str, steps: int) -> tuple[float, float, float]:
    """(first loss, last loss, steps/s) of one job of ``backend``."""
    done = subprocess.run([sys.executable, str(EXAMPLE), "--steps", str(steps), "--backend",
                           backend], capture_output=True, text=True, timeout=600, cwd=ROOT)
    match = LINE.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"{backend} run failed:\n{done.stdout}\n{done.stderr}")
    first, last, rate = (float(g) for g in match.groups())
    return first, last, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--json", help="also write the results here (bench/_report.py's format)")
    args = parser.parse_args()
    recorder = Recorder("autograd")
    rates: dict[str, list[float]] = {"ringtorch": [], "torch": []}
    losses: dict[str, tuple[float, float]] = {}
    for r in range(args.rounds):
        order = ["ringtorch", "torch"] if r % 2 == 0 else ["torch", "ringtorch"]
        for backend in order:
            first, last, rate = run_once(backend, args.steps)
            rates[backend].append(rate)
            losses[backend] = (first, last)
            print(f"round {r}: {backend:9s} {rate:8.1f} steps/s  loss {first:.3f} -> {last:.3f}",
                  flush=True)
    ring, torch_ = statistics.median(rates["ringtorch"]), statistics.median(rates["torch"])
    print()
    print("| program | torch steps/s | ringtorch steps/s | ringtorch / torch |")
    print("|---|---|---|---|")
    print(f"| seed 004 ({args.steps} steps, median of {args.rounds} rounds) | {torch_:.1f} | "
          f"{ring:.1f} | {ring / torch_:.2f}x |")
    same = all(abs(a - b) < 1e-2 for a, b in zip(losses["ringtorch"], losses["torch"],
                                                  strict=True))
    print(f"\nlosses (first 5 mean, last 5 mean): ringtorch {losses['ringtorch']}, "
          f"torch {losses['torch']}: {'same' if same else 'DIFFERENT'}")
    # results: {"rounds", "steps", "torch_steps_s", "ringtorch_steps_s" (medians),
    # "per_round": {system: [steps/s]}, "losses": {system: [first, last]}, "same_losses"}
    recorder.write(args.json, {"rounds": args.rounds, "steps": args.steps,
                               "torch_steps_s": torch_, "ringtorch_steps_s": ring,
                               "per_round": rates, "losses": losses, "same_losses": same})


if __name__ == "__main__":
    main()

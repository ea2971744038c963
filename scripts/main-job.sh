#!/usr/bin/env bash
# Set everything up (scripts/setup.sh) and run the main job: DDP training of a small CNN on
# scikit-learn's handwritten digits, 2 processes launched by ringrun. Extra arguments go to
# examples/train.py (for example --epochs 3, or --resume).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh examples
exec .venv/bin/ringrun --nproc-per-node 2 examples/train.py "$@"

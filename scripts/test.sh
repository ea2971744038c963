#!/usr/bin/env bash
# Set everything up (scripts/setup.sh) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test mpi
exec .venv/bin/python -m pytest "$@"

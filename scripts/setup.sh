#!/usr/bin/env bash
# Create .venv beside the repository (if missing) and install ringtorch into it with the extras
# named as arguments (default: test). torch is pinned to 2.13.0 here (the CPU build); the
# package itself accepts a range.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
extras="${*:-test}"
extras="${extras// /,}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install --quiet "torch==2.13.0" "numpy>=1.24"
.venv/bin/python -m pip install --quiet -e ".[${extras}]"

#!/usr/bin/env bash
# Set everything up (scripts/setup.sh) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test mpi
# Two workers, a file at a time (tests/conftest.py says why that is safe and what runs together),
# in the order collected: the long integration files first, the many short unit files last to
# even out the end (xdist's default order, most tests first, left a few long files for the end);
# a later -n (-n 0: one process) overrides. The default suite leaves out the files marked slow
# (whole files of long tests: the fault matrix, torch's elastic launch tests, ...); a later -m
# overrides that too: `bash scripts/test.sh -m slow` runs them, as CI does after the default.
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not slow" "$@"

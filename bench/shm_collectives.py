"""The shared-memory comparison with its old defaults: runs bench/collectives.py.

    python bench/shm_collectives.py --world-sizes 2 --ops all_reduce --libs shm,mpi --repeat 3

is ``python bench/collectives.py`` with world size 2, the four ops, libraries shm, sockets,
gloo and mpi, a 1800 s timeout and cells that show the median of the --repeat runs (with
their spread); every option given here overrides those defaults. See bench/collectives.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULTS = ["--world-sizes", "2", "--ops", "all_reduce,broadcast,all_gather,reduce_scatter",
            "--libs", "shm,sockets,gloo,mpi", "--timeout", "1800", "--repeat-stat", "median"]

if __name__ == "__main__":
    script = str(Path(__file__).resolve().with_name("collectives.py"))
    os.execv(sys.executable, [sys.executable, script, *DEFAULTS, *sys.argv[1:]])

"""Runs under `mpirun -n N`: the backend conformance suite on the MPI backend.

Usage: mpirun -n N python tests/mpi/conformance.py OUTDIR

Each rank initialises the default group with backend "mpi" (rank and size come from MPI),
runs ``ringtorch.testing.run_backend_cases`` and pickles its report into OUTDIR/rank{R}.pkl;
tests/conformance/test_backend.py checks the reports with ``assert_conforms``.
"""

from __future__ import annotations

import os
import pickle
import sys

import ringtorch.distributed as dist
from ringtorch.testing import run_backend_cases


def main() -> None:
    outdir = sys.argv[1]
    dist.init_process_group("mpi")
    report = run_backend_cases(outdir)
    dist.destroy_process_group()
    path = os.path.join(outdir, f"rank{report.rank}.pkl")
    with open(path + ".tmp", "wb") as f:
        pickle.dump(report, f)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()

"""Runs WITHOUT mpirun: what the MPI backend does in a process no MPI launcher started.

Usage: python tests/mpi/singleton.py OUTFILE [THREAD_LEVEL]

Pickles into OUTFILE what it saw: whether importing the backend loaded MPI, the (rank, size)
MPI gave and the warnings that came with it, a few operations on the world of one, or, with
THREAD_LEVEL set (mpi4py.rc.thread_level, e.g. "single"), the error creating the backend.
"""

from __future__ import annotations

import pickle
import sys
import time
import warnings
from datetime import timedelta

from ringtorch._observe.operation import Operation, issued
from ringtorch.collectives.backends import mpi_env  # light: neither torch nor mpi4py


def D() -> float:
    """The deadline of one operation: a minute from now."""
    return time.monotonic() + 60.0


def op(seq: int, deadline: float | None = None) -> Operation:
    """The operation of one direct backend call: sequence number ``seq``, started now."""
    return issued("test", seq, D() if deadline is None else deadline)


def main() -> None:
    thread_level = sys.argv[2] if len(sys.argv) > 2 else None
    if thread_level is None:  # (the refusal below needs no torch: it starts faster without)
        import torch

        from ringtorch.collectives.backends import mpi as mpi_backend  # must not load MPI
        from ringtorch.collectives.backends.base import BackendContext
        from ringtorch.collectives.reduce_op import ReduceOp
    seen: dict = {"mpi_loaded_by_import": "mpi4py.MPI" in sys.modules}
    if thread_level is not None:
        import mpi4py

        mpi4py.rc.thread_level = thread_level
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            seen["rank_and_size"] = mpi_env.world_rank_and_size()
            ctx = BackendContext(store=None, rank=0, size=1, timeout=timedelta(seconds=30),
                                 group_name="default", global_ranks=(0,))
            backend = mpi_backend.MpiBackend(ctx)
            buf = torch.tensor([1.5, -2.0])
            backend.all_reduce(buf, ReduceOp.SUM, op(1))
            backend.broadcast(buf, 0, op(2))
            backend.barrier(op(3))
            seen["all_reduce"] = buf.tolist()
            backend.close()
        except Exception as exc:  # the driver asserts on it
            seen["error"] = (type(exc).__name__, str(exc))
    seen["warnings"] = [str(w.message) for w in caught]
    with open(sys.argv[1], "wb") as f:
        pickle.dump(seen, f)


if __name__ == "__main__":
    main()

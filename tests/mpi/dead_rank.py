"""Runs under `mpirun -n 2`: one rank ends the job while the other waits for it in a receive.

Usage: mpirun -n 2 python tests/mpi/dead_rank.py [exit|abort]

exit: rank 1 exits (os._exit(3)); abort: rank 1 calls MpiBackend.abort(reason), which calls
MPI_Abort. MPI cannot tell one rank that another died; the launcher ends the whole job instead.
Rank 0 prints "rank 0 returned" only if its receive ever returned, which must not happen.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch

from ringtorch._observe.operation import Operation, issued
from ringtorch.collectives.backends import mpi_env
from ringtorch.collectives.backends.base import BackendContext
from ringtorch.collectives.backends.mpi import MpiBackend


def D() -> float:
    return time.monotonic() + 60.0


def op(seq: int, deadline: float | None = None) -> Operation:
    """The operation of one direct backend call: sequence number ``seq``, started now."""
    return issued("test", seq, D() if deadline is None else deadline)


rank, size = mpi_env.world_rank_and_size()
backend = MpiBackend(BackendContext(store=None, rank=rank, size=size, timeout=timedelta(seconds=30),
                                    group_name="default", global_ranks=tuple(range(size))))
backend.barrier(op(1))
if rank == 1 and sys.argv[1:] == ["abort"]:
    backend.abort("the test asked for it")
    print("rank 1 returned from abort", flush=True)
elif rank == 1:
    print("rank 1 exits now", flush=True)
    os._exit(3)
backend.recv(torch.zeros(4), 1, 0, D())
print("rank 0 returned", flush=True)
sys.exit(0)

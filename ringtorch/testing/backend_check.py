"""``check_backend``: the conformance suite a collective backend must pass, in one call.

Every collective (all_reduce, reduce, broadcast, all_gather in its list, tensor and uneven
forms, gather, scatter, reduce_scatter in both forms, all_to_all even and uneven, barrier,
send/recv, isend/irecv and batches, the async ``Work`` forms) x every dtype torch has that
the collective takes x every reduction, with the (reduction, dtype) pairs torch refuses
checked as errors, at the world size asked for. Expected results come from one NumPy oracle
(``_oracle.py``), never from ringtorch. One set of processes runs every case, so a world
costs its start-up plus a second or two; every failing case is reported with its name, the
world size and the rank.

A backend is given the way ``Backend.register_backend`` takes it (torch's creator shape), or
by the name of a backend already known (``"gloo"``, ``"mpi"``): the suite drives it through
``init_process_group`` and the public ``ringtorch.distributed`` functions, as users reach it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from ringtorch.testing._backend_cases import CaseReport, run_backend_cases
from ringtorch.testing.harness import run_ranks

# The name a creator function is registered under in the suite's processes.
UNDER_TEST = "conformance_under_test"


class BackendConformanceError(AssertionError):
    """A backend failed cases of the conformance suite; ``failures`` lists them all."""

    def __init__(self, failures: list[str]) -> None:
        shown = "\n".join(failures[:40])
        more = f"\n... and {len(failures) - 40} more" if len(failures) > 40 else ""
        super().__init__(f"{len(failures)} conformance failures:\n{shown}{more}")
        self.failures = failures


def check_backend(make_backend: str | Callable[..., Any], world_size: int, *,
                  env: Mapping[str, str] | None = None,
                  rank_env: Sequence[Mapping[str, str]] | None = None,
                  timeout: float = 180.0,
                  op_timeout: timedelta = timedelta(seconds=60)) -> list[CaseReport]:
    """Run the conformance suite on ``world_size`` real processes; raise on any failure.

    Args:
        make_backend: a creator function as ``Backend.register_backend(name, func)`` takes
            it, ``func(store, rank, world_size, timeout)`` returning a
            ``ringtorch.collectives.backends.base.Backend`` (a module-level function: the
            ranks are separate processes that import it by name); or the name of a backend
            ``init_process_group`` knows (``"gloo"``).
        world_size: how many ranks; odd and even ones find different bugs.
        env: environment variables of every rank (``RINGTORCH_*`` knobs, for instance).
        rank_env: per-rank environment variables, ``rank_env[rank]`` (a host id per rank).
        timeout: seconds the whole run may take before every rank is killed.
        op_timeout: the group's timeout for one collective.

    Returns:
        Every rank's report (cases run, digests), for callers that check more.

    Raises:
        BackendConformanceError: cases failed (each named with the world size and rank), or
            the ranks computed different bits for the same reduction.
        ringtorch.testing.RankFailed: a rank died or failed outside a case (e.g. in
            ``init_process_group``).
    """
    if rank_env is not None and len(rank_env) != world_size:
        raise ValueError(f"rank_env has {len(rank_env)} entries for a world of {world_size}")
    with tempfile.TemporaryDirectory(prefix="ringtorch-conformance-") as markers:
        reports = run_ranks(_rank_main, world_size, timeout=timeout, env=env,
                            args=(make_backend, markers, rank_env, op_timeout))
    assert_conforms(reports)
    return reports


def assert_conforms(reports: Sequence[CaseReport]) -> None:
    """Raise ``BackendConformanceError`` unless every rank passed every case and every
    rank's all_reduce results are bitwise identical (for a run started another way, e.g.
    under ``mpirun``, with ``run_backend_cases`` in each rank).
    """
    failures = [f for report in reports for f in report.failures]
    world = len(reports)
    counts = {report.cases for report in reports}
    if len(counts) != 1 or not counts.pop():
        failures.append(f"the ranks ran {[r.cases for r in reports]} cases (world {world})")
    for case in sorted(reports[0].digests if reports else ()):
        digests = [report.digests.get(case) for report in reports]
        if len(set(digests)) != 1:
            differ = [r for r, d in enumerate(digests) if d != digests[0]]
            failures.append(f"{case} (world {world}): ranks {differ} computed other bits than "
                            f"rank 0 (a reduction must run in one order on every rank)")
    if failures:
        raise BackendConformanceError(failures)


def _rank_main(rank: int, world_size: int, make_backend: str | Callable[..., Any],
               marker_dir: str, rank_env: Sequence[Mapping[str, str]] | None,
               op_timeout: timedelta) -> CaseReport:
    import ringtorch.distributed as dist

    if rank_env is not None:
        os.environ.update(rank_env[rank])
    name = make_backend
    if not isinstance(make_backend, str):
        dist.Backend.register_backend(UNDER_TEST, make_backend, devices=["cpu"])
        name = UNDER_TEST
    dist.init_process_group(name, timeout=op_timeout)
    try:
        return run_backend_cases(marker_dir)
    finally:
        dist.destroy_process_group()


__all__ = ["BackendConformanceError", "assert_conforms", "check_backend"]

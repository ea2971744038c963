"""The fault matrix, ringtorch's column: every failure ends as a named DistError, in bounds.

Three real workloads (an all_reduce loop, DDP training, an RPC loop) run across two hosts
(two network namespaces, ``ringtorch.testing.netns``), the store on host 0 with rank 0, and
one fault strikes: the link is cut silently (partition), the last rank is SIGKILLed or
SIGSTOPped, or rank 0, whose process hosts the TCPStore server, is SIGKILLed. The targets,
checked on every rank of every cell:

* each rank ends with a ``DistError`` subclass whose first line names the culprit (the
  struck rank; for a partition, a rank on the other host);
* a dead process is reported in under 1 s, the store's death in under 2 s, a partition
  within the bound the configuration promises (1.5 x ``RINGTORCH_TCP_USER_TIMEOUT_MS``, as
  the default 10 s promises under 15 s), a frozen rank by the stall warning naming it
  (collectives; logged before the error) and then an error within the group's timeout
  (plus half a second: see TIMEOUT_SLACK_S);
  the frozen rank itself, once resumed, fails at once with a DistError naming a rank;
* every process exits, and no process, /dev/shm segment or listening port is left.

Timeouts are short here through the existing knobs, so the matrix fits the suite's budget;
``scripts/fault_matrix.py`` runs the full sweep (worlds 2 to 4, torch beside ringtorch) and
writes docs/fault-matrix.md.
"""

from __future__ import annotations

import re

import pytest

from ringtorch.testing.fault_matrix import Cell, CellResult, Settings, named_ranks, run_cell

# long (the whole fault matrix runs in the slow stage: README, Tests)
pytestmark = [pytest.mark.netns, pytest.mark.slow]

USER_TIMEOUT_S = 2.0
STALL_WARNING_S = 1.0
# The hang report the timeout names waits this long for the frozen rank's answer; it is begun
# this long (plus a second for signalled stacks) ahead of the deadline (docs/hang-report.md).
HANG_REPORT_WAIT_S = 1.0
SETTINGS = Settings(timeout_s=6.0, cap_s=20.0, exit_grace_s=5.0, env=(
    ("RINGTORCH_TCP_USER_TIMEOUT_MS", str(int(USER_TIMEOUT_S * 1000))),
    ("RINGTORCH_STALL_WARNING_S", str(STALL_WARNING_S)),
    ("RINGTORCH_HANG_REPORT_WAIT_S", str(HANG_REPORT_WAIT_S)),
))
DEAD_PROCESS_S = 1.0
STORE_DEATH_S = 2.0
PARTITION_S = 1.5 * USER_TIMEOUT_S + 0.5   # the promise, plus a scheduler's half second
# a frozen rank fails the others at the group's timeout itself: a wait's last slice ends at
# the deadline, the late ranks were asked where they are a second ahead of it, and the hang
# report the error names was begun ahead of it too (docs/design/failure-detection.md, G5;
# docs/hang-report.md); the hierarchy's graces (0.2 s, 0.4 s) and a scheduler's tenth of a
# second fit in this
TIMEOUT_SLACK_S = 0.5
RESUMED_S = 2.0

# world sizes chosen per cell to keep the matrix within about two minutes on two cores;
# every workload meets every fault, and every layout (1+1, 2+1, 1+2, 2+2) appears
CELLS = [
    Cell("all_reduce", "partition", (2, 2)),
    Cell("all_reduce", "sigkill", (2, 2)),
    Cell("all_reduce", "sigstop", (1, 2)),
    Cell("all_reduce", "store_death", (2, 1)),
    Cell("ddp", "partition", (1, 1)),
    Cell("ddp", "sigkill", (2, 1)),
    Cell("ddp", "sigstop", (1, 1)),
    Cell("ddp", "store_death", (1, 1)),
    Cell("rpc", "partition", (1, 1)),
    Cell("rpc", "sigkill", (1, 2)),
    Cell("rpc", "sigstop", (1, 1)),
    Cell("rpc", "store_death", (1, 1)),
]


def _bound(cell: Cell) -> float:
    return {"partition": PARTITION_S, "sigkill": DEAD_PROCESS_S, "store_death": STORE_DEATH_S,
            "sigstop": SETTINGS.timeout_s + TIMEOUT_SLACK_S}[cell.fault]


def missed_targets(result: CellResult) -> list[str]:
    """Every target of the module docstring that ``result`` misses, one line each."""
    cell, missed = result.cell, []
    for o in result.outcomes:
        who = f"rank {o.rank} (host {o.host})"
        if o.killed:
            continue
        if o.error_s is None:
            missed.append(f"{who} raised nothing within {SETTINGS.cap_s} s; stderr: "
                          f"{o.stderr_tail[-600:]!r}")
            continue
        said = f"{o.error_type}: {o.first_line!r}"
        if not o.dist_error:
            missed.append(f"{who} ended with a {said}, not a DistError")
        resumed = cell.fault == "sigstop" and o.rank == cell.victim
        if resumed:
            if o.error_s > RESUMED_S or not o.named_ranks:
                missed.append(f"{who}, resumed, took {o.error_s:.2f} s (bound {RESUMED_S} s) "
                              f"to raise {said}, which should name a rank")
        else:
            if not set(o.named_ranks) & cell.culprits(o.rank):
                missed.append(f"{who}: {said} names ranks {o.named_ranks}, none of the "
                              f"culprits {sorted(cell.culprits(o.rank))}")
            if o.error_s > _bound(cell):
                missed.append(f"{who} took {o.error_s:.2f} s (bound {_bound(cell):.1f} s) to "
                              f"raise {said}")
        if cell.fault == "sigstop" and cell.workload != "rpc" and not resumed:
            # the wait may have begun before the fault: only the order is certain
            stalls = [t for t, line in o.warnings
                      if "has waited" in line and cell.victim in named_ranks(line)]
            if not stalls or stalls[0] > o.error_s:
                missed.append(f"{who} logged no stall warning naming rank {cell.victim} "
                              f"before its error; warnings: {o.warnings}")
        if o.exit_s is None:
            missed.append(f"{who} was still running {SETTINGS.exit_grace_s} s after its error")
    for what, left in (("processes", result.left_processes), ("/dev/shm files", result.left_shm),
                       ("listening ports", result.left_ports)):
        if left:
            missed.append(f"{what} left behind: {left}")
    return missed


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.name)
def test_every_rank_ends_with_a_dist_error_naming_the_culprit_in_bounds(cell: Cell) -> None:
    result = run_cell(cell, "ringtorch", SETTINGS)
    missed = missed_targets(result)
    assert not missed, f"{cell.name}:\n" + "\n".join(missed)


def test_a_rank_that_fails_before_its_steps_stops_the_cell_with_its_stderr() -> None:
    broken = Settings(timeout_s=6.0, env=(("RINGTORCH_TCP_USER_TIMEOUT_MS", "soon"),))
    with pytest.raises(RuntimeError, match=r"^all_reduce-sigkill-1\+1: rank [01] exited with 1 "
                                           r"before it ran its steps:\n") as failed:
        run_cell(Cell("all_reduce", "sigkill", (1, 1)), "ringtorch", broken)
    assert re.search(r"environment variable RINGTORCH_TCP_USER_TIMEOUT_MS='soon' is invalid",
                     str(failed.value)), failed.value

"""scripts/fault_matrix.py --update: the selected cells' rows are replaced for the measured
library only; every other cell and library keeps what the page said, the summary is redone
from the page's tables and a line says what was re-measured. Pages are made here from
made-up results with the script's own ``render`` (the one whole-page writer)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ringtorch.testing.fault_matrix import Cell, CellResult, RankOutcome, Settings

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "fault_matrix.py"
STOP = Cell("all_reduce", "sigstop", (1, 1))
KILL = Cell("all_reduce", "sigkill", (1, 1))


def _script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("fault_matrix_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(cell: Cell, lib: str, seconds: float, said: str) -> CellResult:
    outcomes = [RankOutcome(0, 0, seconds, seconds + 0.1, "DistBackendError", True, said, said,
                            [1]),
                RankOutcome(1, 1, 0.01, 0.1, "DistBackendError", True, said, said, [1])]
    return CellResult(cell, lib, Settings(), outcomes, [], [], [], ("10.0.0.1", "10.0.0.2"))


def test_update_replaces_only_the_measured_cells_of_the_measured_library() -> None:
    script = _script()
    before = [_result(STOP, "ringtorch", 22.44, "ranks [1] did not arrive (old)"),
              _result(STOP, "torch", 20.05, "Timed out waiting"),
              _result(KILL, "ringtorch", 0.22, "rank 1 closed its connection"),
              _result(KILL, "torch", 1.47, "Connection closed by peer")]
    page = script.render(before, Settings(), ["ringtorch", "torch"], "cmd")
    again = _result(STOP, "ringtorch", 20.01, "ranks [1] did not arrive (new)")
    updated = script.update(page, [again], "cmd --update")
    lines = updated.splitlines()
    assert "| SIGSTOP of the last rank | 1 + 1 | all_reduce | 20.01 s | 20.05 s |" in lines
    assert "| SIGKILL of the last rank | 1 + 1 | all_reduce | 0.22 s | 1.47 s |" in lines
    assert "(new)" in updated and "(old)" not in updated
    assert updated.count("Timed out waiting") == page.count("Timed out waiting") == 1
    assert any(line.startswith("* **ringtorch**: in 2 of 2 cells") and
               "SIGSTOP of the last rank 20.01 s" in line for line in lines), updated
    assert any(line.startswith("* **torch 2.13 (gloo, TensorPipe)**: in 2 of 2 cells") and
               "SIGSTOP of the last rank 20.05 s" in line for line in lines), updated
    assert any(line.startswith("Re-measured ") and "(`cmd --update`): ringtorch in the cells "
               "sigstop 1+1 all_reduce." in line for line in lines), updated
    assert script.update(updated, [again], "cmd --update").count("Re-measured ") == 1

"""docs/env-vars.md lists every environment variable ringtorch/ reads, not only its knobs.

The reads are found in the code (tests/architecture/_env_reads.py walks every module's syntax
tree), so a variable newly read anywhere, torch's or a launcher's, fails here until the page
has its row.
"""

from __future__ import annotations

import re
from pathlib import Path

from ringtorch import _config
from tests.architecture._env_reads import Read, environment_reads

DOC = Path(__file__).resolve().parents[2] / "docs" / "env-vars.md"

# Reads whose key no source text names, with what stands for it instead.
NAMED_ELSEWHERE = {
    ("ringtorch._config", "get"): "a knob's own name: every name in _config.KNOBS",
    ("ringtorch.distributed.elastic.utils.api", "get_env_variable_or_raise"):
        "torch's helper, reading whichever variable its caller names",
}


def documented() -> set[str]:
    """The variables in the first column of the page's tables (``PET_<FLAG>`` as ``PET_*``)."""
    names = set()
    for line in DOC.read_text().splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names |= {re.sub(r"<[A-Z_]+>", "*", n) for n in re.findall(r"`([^`]+)`", first)}
    return names


def read_names(reads: tuple[Read, ...]) -> dict[str, list[str]]:
    """Every variable read -> where (module:line); knobs come from _config.KNOBS."""
    where: dict[str, list[str]] = {name: ["ringtorch._config"] for name in _config.KNOBS}
    for read in reads:
        for name in read.names or ():
            where.setdefault(name, []).append(f"{read.module}:{read.line}")
    return where


def test_every_variable_read_in_the_code_has_a_row() -> None:
    missing = {name: places for name, places in read_names(environment_reads()).items()
               if name not in documented()}
    assert not missing, f"variables read by ringtorch without a row in docs/env-vars.md: {missing}"


def test_every_read_has_a_key_the_walk_can_name() -> None:
    unresolved = [f"{r.module}:{r.line} ({r.function})" for r in environment_reads()
                  if r.names is None and (r.module, r.function) not in NAMED_ELSEWHERE]
    assert not unresolved, (
        f"environment reads whose variable the walk cannot name: {unresolved}; use a string, "
        "a module-level constant or a parameter its callers give a string, or add the read to "
        "NAMED_ELSEWHERE saying what names it")


def test_the_walk_sees_each_form_of_read() -> None:
    # the reads the page once lacked, each in another form: os.getenv, a constant resolved,
    # a local mapping named environ, a table through a loop, a parameter through its callers
    where = read_names(environment_reads())
    for name in ("PYTHON_EXEC", "TORCH_MP_PARALLEL_START", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE",
                 "CUDA_VISIBLE_DEVICES", "SLURM_PROCID", "MASTER_PORT", "OMP_NUM_THREADS",
                 "PET_*", "RINGTORCH_SECRET"):
        assert name in where, name

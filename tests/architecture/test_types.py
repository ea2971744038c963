"""The packages whose types are checked: ``mypy`` finds nothing in them.

Each listed package is checked with the settings of ``[tool.mypy]`` in pyproject.toml
(modules outside the list are read for their types, their own errors are not reported).
mypy's cache lives in a temporary directory, so the check never writes into the tree.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECKED = [
    "ringtorch/collectives",
    "ringtorch/distributed/rpc",
    "ringtorch/_device",
]


def test_mypy_finds_nothing_in_the_checked_packages(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "mypy-cache"),
         "--config-file", str(ROOT / "pyproject.toml"), *CHECKED],
        cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"mypy found problems:\n{result.stdout}{result.stderr}"

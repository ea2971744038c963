"""docs/api.md's program that runs the examples works as written, on 3 processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_api_tour_in_the_docs_runs_under_ringrun(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "api.md").read_text()
    tour = doc[doc.index("## A program that runs the examples"):]
    program = re.search(r"```python\n(.*?)```", tour, re.S)
    assert program, "docs/api.md has no tour program"
    script = tmp_path / "api_tour.py"
    script.write_text(program.group(1))
    result = subprocess.run([sys.executable, "-m", "ringtorch.launcher", "--nproc-per-node", "3",
                             str(script)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=90, env={**os.environ})
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in range(3):
        assert f"rank {rank}: api tour passed" in result.stdout, result.stdout[-2000:]

"""docs/rpc.md's tour of the RPC, distributed autograd and optimizer API runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_rpc_api_tour_in_the_docs_runs_under_ringrun(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "rpc.md").read_text()
    program = re.search(r"```python\n(.*?)```", doc, re.S)
    assert program, "docs/rpc.md has no python block"
    script = tmp_path / "rpc_tour.py"
    script.write_text(program.group(1))
    result = subprocess.run([sys.executable, "-m", "ringtorch.launcher", "--nproc-per-node", "2",
                             str(script)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=90, env={**os.environ})
    assert result.returncode == 0, result.stderr[-4000:]
    assert "rpc tour: all checks passed" in result.stdout, result.stdout[-2000:]

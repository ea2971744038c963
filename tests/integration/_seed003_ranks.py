"""Run one of examples/seed003_*.py as ``python <program> --rank R --world_size N`` would, in
a run_ranks worker (torch already imported): the file runs as ``__main__`` with that argv,
and its printed output is returned."""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_program(rank: int, world_size: int, program: str, init_method: str) -> str:
    argv = [program, "--rank", str(rank), "--world_size", str(world_size),
            "--init_method", init_method]
    out = io.StringIO()
    saved = sys.argv
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(ROOT / "examples" / program), run_name="__main__")
    finally:
        sys.argv = saved
    return out.getvalue()

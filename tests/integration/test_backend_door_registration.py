"""Registering backend "ringtorch" costs `import torch` almost nothing: torch's backend
autoload runs ringtorch's entry point, which names the backend, imports no engine module and
starts no thread; TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns it off, as torch documents."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SEEN = """
import json, sys, threading
import torch.distributed as dist
from importlib.metadata import entry_points
seen = {
    "entry_points": [ep.value for ep in entry_points(group="torch.backends")
                     if ep.name == "ringtorch"],
    "registered": "RINGTORCH" in dist.Backend._plugins,
    "modules": sorted(m for m in sys.modules if m.split(".")[0] == "ringtorch"),
    "threads": [t.name for t in threading.enumerate()],
}
"""

# with the autoload off, load and run the entry point by hand, timed: its whole cost
TIMED = """
import time
import torch
from importlib.metadata import entry_points
(point,) = [ep for ep in entry_points(group="torch.backends") if ep.name == "ringtorch"]
start = time.perf_counter()
point.load()()
cost_ms = (time.perf_counter() - start) * 1000
""" + SEEN + """
seen["cost_ms"] = cost_ms
"""

REFUSED = SEEN + """
try:
    dist.init_process_group("ringtorch", store=dist.HashStore(), rank=0, world_size=1)
except Exception as exc:
    seen["init"] = f"{type(exc).__name__}: {exc}"
"""


def _run(code: str, **env: str) -> dict:
    result = subprocess.run([sys.executable, "-W", "ignore", "-c",
                             code + "\nprint(json.dumps(seen))"],
                            env={**os.environ, **env}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_import_torch_registers_ringtorch_without_the_engine_or_a_thread() -> None:
    seen = _run("import torch\n" + SEEN)
    assert seen == {"entry_points": ["ringtorch.c10d.autoload:register"], "registered": True,
                    "modules": ["ringtorch", "ringtorch.c10d", "ringtorch.c10d.autoload"],
                    "threads": ["MainThread"]}


def test_the_entry_point_costs_a_few_milliseconds_at_most() -> None:
    seen = _run(TIMED, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert seen["registered"] is True and seen["threads"] == ["MainThread"]
    assert seen["cost_ms"] < 20.0, seen  # about 1 ms here (docs/backend-door.md)


def test_with_the_autoload_off_torch_does_not_know_the_name() -> None:
    seen = _run(REFUSED, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert (seen["registered"], seen["modules"]) == (False, [])
    assert seen["init"] == "AssertionError: Unknown backend type ringtorch"

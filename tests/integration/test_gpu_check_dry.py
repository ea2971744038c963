"""scripts/gpu_check.sh's dry run (GPU_CHECK_DRY=1): the whole GPU check on this CPU machine,
on the simulated runtime, so that no GPU minute is spent on a mistake the CPU can show. It
finishes with at most 8 files and no folder in OUTDIR, the summary written last, every stage
in it; the probe's checks pass or say why they do not apply."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

# each test runs the whole check (about 20 s alone, more on a loaded machine)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.sh"


def _dry_run(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), str(out)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "GPU_CHECK_DRY": "1", **env})


def _summary(out: Path) -> dict[str, str]:
    lines = (out / "summary.txt").read_text().splitlines()
    return {line.split(":", 1)[0]: line.split(":", 1)[1].strip()
            for line in lines if line.split(":", 1)[0] in ("probe", "pytest", "rerun", "bench")}


def test_the_dry_run_finishes_with_its_files_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = _dry_run(out)
    assert done.returncode == 0, done.stdout + done.stderr
    files = list(out.iterdir())
    assert all(path.is_file() for path in files)
    assert len(files) <= 8
    assert {path.name for path in files} >= {"probe.json", "probe.txt", "probe.log", "pytest.log",
                                             "pytest-junit.xml", "rerun.log", "summary.txt"}
    assert max(files, key=lambda path: path.stat().st_mtime_ns).name == "summary.txt"
    stages = _summary(out)
    assert stages["probe"].startswith("passed"), stages
    assert stages["pytest"].startswith("passed"), stages  # the nccl_lib tests run here
    assert stages["rerun"] == "not needed (no failures)"
    if (SCRIPT.parents[1] / "bench" / "gpu.py").exists():
        assert stages["bench"].startswith("passed"), stages
    else:
        assert stages["bench"] == "not present"
    checks = {check["check"]: check for check in json.loads((out / "probe.json").read_text())
              ["checks"]}
    assert checks["nccl_world_1"]["status"] == "not run"
    assert checks["nccl_world_1"]["error"] == "no CUDA device"
    assert {name for name, check in checks.items() if check["status"] == "passed"} == {
        "environment", "nccl_library", "runtime_contract", "pinned_copies", "ipc_exchange",
        "torch_gloo"}
    assert checks["environment"]["result"]["runtime"] == "sim"


def test_a_failed_check_and_no_selected_tests_are_reported_as_such(tmp_path: Path) -> None:
    out = tmp_path / "out"
    missing = str(tmp_path / "libnccl.so.2")
    done = _dry_run(out, RINGTORCH_NCCL_LIBRARY=missing)
    assert done.returncode == 1  # the probe's NCCL check failed
    stages = _summary(out)
    assert stages["probe"].startswith("failed (exit 1"), stages
    assert stages["probe"].endswith("5 passed, 1 failed, 1 not run"), stages
    # every nccl_lib test deselected (no library), every gpu test (no GPU): pytest's exit 5
    assert stages["pytest"].startswith("no tests ran (none selected here) (exit 5"), stages
    assert stages["rerun"] == "not needed (no failures)"
    nccl = next(check for check in json.loads((out / "probe.json").read_text())["checks"]
                if check["check"] == "nccl_library")
    assert f"FileNotFoundError: RINGTORCH_NCCL_LIBRARY='{missing}': no such file" in nccl["error"]

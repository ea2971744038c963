"""``python -m ringtorch.distributed.launch``: the legacy launcher the seed posts use.

Scripts written for ``torch.distributed.launch`` parse ``--local_rank`` (seed 001:
``parser.add_argument('--local_rank', type=int)``) and read MASTER_ADDR, MASTER_PORT, RANK
and WORLD_SIZE from the environment for ``init_method='env://'``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SEED_STYLE = r"""
import argparse, json, os
parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=None)
parser.add_argument("--epochs", type=int)
args = parser.parse_args()
keys = ["MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"]
report = {"local_rank_arg": args.local_rank, "epochs": args.epochs,
          "env": {k: os.environ.get(k) for k in keys}}
with open(os.path.join(os.environ["OUT_DIR"], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(report, f)
"""


def launch(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringtorch.distributed.launch", *args],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


def test_legacy_launch_passes_local_rank_and_sets_the_environment(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SEED_STYLE)
    result = launch(["--nproc_per_node=2", "--master_port", "0", str(script), "--epochs", "3"],
                    {"OUT_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "FutureWarning: The module ringtorch.distributed.launch is deprecated" in result.stderr
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["local_rank_arg"] == rank
        assert report["epochs"] == 3
        env = report["env"]
        assert (env["RANK"], env["LOCAL_RANK"]) == (str(rank), str(rank))
        assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("2", "2")
        assert env["MASTER_ADDR"] == "127.0.0.1" and int(env["MASTER_PORT"]) > 0


def test_use_env_passes_the_local_rank_in_the_environment_only(tmp_path: Path) -> None:
    package = tmp_path / "seedpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(SEED_STYLE)
    result = launch(["--use_env", "--nproc_per_node", "2", "-m", "seedpkg.train"],
                    {"OUT_DIR": str(tmp_path), "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["local_rank_arg"] is None
        assert report["env"]["LOCAL_RANK"] == str(rank)

"""Without ringrun: jobs started by SLURM's srun or by mpirun, as docs/launching.md tells.

``init_process_group(init_method="env://")`` takes the rank and world size from SLURM's or
Open MPI's variables; MASTER_ADDR, MASTER_PORT and RINGTORCH_SECRET come from the user. The
script runs a real all_reduce, so the ranks it reports are the ones the group agreed on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ringtorch.testing.harness import job_port

TRAIN = r"""
import json, os, sys
import torch
import ringtorch.distributed as dist
from ringtorch.rendezvous import rank_from_env

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
local = rank_from_env(os.environ, 2)
with open(os.path.join(sys.argv[1], "rank%d.json" % rank), "w") as f:
    json.dump({"rank": rank, "world": world, "sum": total.item(), "local": list(local)}, f)
dist.destroy_process_group()
"""

_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS",
                   "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
                   "PMI_SIZE")


def job_env() -> dict[str, str]:
    """What the batch script exports: master address and port, and the job secret."""
    port = job_port()  # below the ephemeral range: no outgoing connection takes it meanwhile
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARIABLES}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               RINGTORCH_SECRET="f" * 64, OMP_NUM_THREADS="1")
    return env


def reports(directory: Path, world: int) -> list[dict]:
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(world)]


def test_a_job_started_like_srun_takes_its_ranks_from_slurm(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    base = job_env()
    # What srun does: one process per task, each with its SLURM_* variables.
    tasks = [subprocess.Popen([sys.executable, str(script), str(tmp_path)],
                              env={**base, "SLURM_PROCID": str(task), "SLURM_NTASKS": "2",
                                   "SLURM_LOCALID": str(task)},
                              stderr=subprocess.PIPE, text=True) for task in range(2)]
    for proc in tasks:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    assert reports(tmp_path, 2) == [
        {"rank": 0, "world": 2, "sum": 3.0, "local": [0, "SLURM_LOCALID"]},
        {"rank": 1, "world": 2, "sum": 3.0, "local": [1, "SLURM_LOCALID"]},
    ]


def test_a_job_started_by_mpirun_takes_its_ranks_from_open_mpi(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    mpirun = shutil.which("mpirun", path=str(Path(sys.executable).parent)) or shutil.which(
        "mpirun")
    assert mpirun, "mpirun not found: install the mpi extra (pip install -e '.[mpi]')"
    env = {**job_env(), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    result = subprocess.run(
        [mpirun, "--oversubscribe", "-n", "2", "-x", "MASTER_ADDR", "-x", "MASTER_PORT",
         "-x", "RINGTORCH_SECRET", sys.executable, str(script), str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120, start_new_session=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert reports(tmp_path, 2) == [
        {"rank": 0, "world": 2, "sum": 3.0, "local": [0, "OMPI_COMM_WORLD_LOCAL_RANK"]},
        {"rank": 1, "world": 2, "sum": 3.0, "local": [1, "OMPI_COMM_WORLD_LOCAL_RANK"]},
    ]

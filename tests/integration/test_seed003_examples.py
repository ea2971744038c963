"""Seed 003's programs (examples/seed003_*.py) run as the blog runs them, on ringtorch.

The scatter program runs as three processes started by hand, ``python seed003_scatter.py
--rank r --world_size 3``, meeting on ``tcp://127.0.0.1:PORT``; the gather and reduce
programs run the same file as ``__main__`` with the same arguments in run_ranks workers
(torch already imported: three fresh interpreters cost seconds each on these machines); the
``mp.spawn`` variant runs as one command. What the ranks print is checked against each
other: every receiver prints what rank 0's list holds for it, rank 0 prints what every
sender sent.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from ringtorch.testing import run_ranks
from ringtorch.testing.harness import job_port
from tests.integration import _seed003_ranks

ROOT = Path(__file__).resolve().parents[2]
VALUE = r"tensor\(\[(-?\d+\.\d*)\]\)"


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


def _by_hand(program: str) -> list[str]:
    """Run the program as three processes started by hand; returns each rank's stdout."""
    init = f"tcp://127.0.0.1:{job_port()}"
    procs = [subprocess.Popen([sys.executable, str(ROOT / "examples" / program), "--rank",
                               str(r), "--world_size", "3", "--init_method", init],
                              cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(3)]
    outputs = []
    try:
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=100)
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                out, _ = proc.communicate()
            outputs.append(out)
    finally:
        for proc in procs:
            proc.kill()
    for rank, proc in enumerate(procs):
        assert proc.returncode == 0, f"{program} rank {rank} failed:\n" + "\n".join(
            f"--- rank {r}:\n{o}" for r, o in enumerate(outputs))
    return outputs


def _in_workers(program: str) -> list[str]:
    """The program as ``__main__`` with ``--rank r --world_size 3``, in three workers."""
    return run_ranks(_seed003_ranks.run_program, 3, timeout=90,
                     args=(program, f"tcp://127.0.0.1:{job_port()}"))


def _spawned() -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "seed003_spawn.py"),
                           "--init_method", f"tcp://127.0.0.1:{job_port()}"], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _floats(text: str) -> list[float]:
    return [float(v) for v in re.findall(VALUE, text)]


def test_scatter_gives_rank_i_element_i_of_rank_0s_list() -> None:
    rank0, rank1, rank2 = _by_hand("seed003_scatter.py")
    sent = _floats(rank0)
    assert len(sent) == 3
    for rank, out in ((1, rank1), (2, rank2)):
        assert re.search(rf"rank {rank} receiving data {VALUE} from -rank0", out), out
        assert _floats(out) == [sent[rank]]


def test_gather_gives_rank_0_every_ranks_weight() -> None:
    rank0, rank1, rank2 = _in_workers("seed003_gather.py")
    got = _floats(rank0)
    assert got[0] == 0.0
    for rank, out in ((1, rank1), (2, rank2)):
        assert re.search(rf"rank {rank} is sending data {VALUE} to rank 0", out), out
        assert got[rank] == _floats(out)[0]


def test_reduce_gives_rank_0_the_maximum_it_asked_for() -> None:
    rank0, rank1, rank2 = _in_workers("seed003_reduce.py")
    sent = [0.0, _floats(rank1)[0], _floats(rank2)[0]]
    assert re.search(rf"rank 1 sending data {VALUE} to rank 0", rank1), rank1
    assert _floats(rank0) == [max(sent)]


def test_spawn_variant_runs_the_three_ranks_in_one_command() -> None:
    out = _spawned()  # three processes share the pipe: lines may interleave, so no splitlines
    listed = re.search(r"\[" + ", ".join([VALUE] * 3) + r"\]", out)
    assert listed, out
    sent = [float(v) for v in listed.groups()]
    for rank in (1, 2):
        got = re.search(rf"rank {rank} receiving data {VALUE} from rank0", out)
        assert got, out
        assert float(got.group(1)) == sent[rank]

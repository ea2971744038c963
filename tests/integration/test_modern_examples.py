"""The modern stack's real programs run on backend "ringtorch" under ringrun and torchrun:
examples/modern/fsdp2_example.py (pytorch/examples' FSDP2 program) and
examples/modern/pipelining_tutorial.py (PyTorch's pipelining tutorial's program).

The FSDP2 program trains, saves its full checkpoint, and a second run resumes from it; the
same two runs on gloo give the losses and checkpoints the runs on ringtorch must equal. The
pipelining program's losses are those of its model run whole in this process.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from ringtorch.testing.harness import job_port

# long (six jobs of two processes, each starting torch: 105-150 s on 2 cores at load 25-30): in the
# slow stage, not the default suite
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "modern"
RINGRUN = Path(sys.executable).parent / "ringrun"


def _launch(launcher: str, script: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "LOCAL_"))}
    head = ([str(RINGRUN)] if launcher == "ringrun"
            else [sys.executable, "-m", "torch.distributed.run"])
    done = subprocess.run([*head, "--nproc-per-node", "2", "--master-port", str(job_port()),
                           str(EXAMPLES / script), *args], env=env, capture_output=True,
                          text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _fsdp2_run(launcher: str, backend: str, folder: Path, *extra: str
               ) -> tuple[list[float], dict[str, torch.Tensor], dict, str]:
    out = _launch(launcher, "fsdp2_example.py", "--backend", backend, "--checkpoint-dir",
                  str(folder), *extra)
    losses = [float(v) for v in re.findall(r"^step \d loss (\S+)$", out, re.M)]
    (saved,) = re.findall(rf"^saved (\S+) on {backend}$", out, re.M)
    return (losses, torch.load(Path(saved) / "model.pt"), torch.load(Path(saved) / "optim.pt"),
            out)


def test_the_fsdp2_example_trains_and_resumes_as_on_gloo(tmp_path: Path) -> None:
    # the first run with the example's two options: bf16 parameters (fp32 reduction) and
    # explicit prefetching (all_gathers issued a layer ahead)
    options = ("--mixed-precision", "--explicit-prefetching")
    first = _fsdp2_run("ringrun", "ringtorch", tmp_path / "ring", *options)
    resumed = _fsdp2_run("torchrun", "ringtorch", tmp_path / "ring", "--dcp-api")
    gloo_first = _fsdp2_run("torchrun", "gloo", tmp_path / "gloo", *options)
    gloo_resumed = _fsdp2_run("torchrun", "gloo", tmp_path / "gloo", "--dcp-api")
    assert "resumed from" not in first[3] and "resumed from" in resumed[3]
    for mine, gloo in ((first, gloo_first), (resumed, gloo_resumed)):
        assert len(mine[0]) == 3
        # two ranks: every sum in the collectives adds two values, exact in any order
        assert mine[0] == gloo[0]
        assert mine[1].keys() == gloo[1].keys()
        for name, ref in gloo[1].items():
            torch.testing.assert_close(mine[1][name], ref, rtol=0, atol=0, msg=name)
        for pid, state in gloo[2]["state"].items():
            for key, ref in state.items():
                torch.testing.assert_close(mine[2]["state"][pid][key], ref, rtol=0, atol=0)
    # the resumed run started from the first run's parameters: its first loss is not the
    # fresh model's on the same batch
    assert resumed[0][0] != first[0][0]


@pytest.mark.parametrize(("launcher", "options"), [
    ("ringrun", ()), ("torchrun", ("--schedule", "1f1b", "--tracer"))])
def test_the_pipelining_tutorial_gives_the_whole_models_losses(
        launcher: str, options: tuple[str, ...]) -> None:
    out = _launch(launcher, "pipelining_tutorial.py", "--dropout", "0", *options)
    (line,) = re.findall(r"^losses: \[(.*)\] on ringtorch$", out, re.M)
    losses = [float(v) for v in line.split(",")]
    tut = _module("pipelining_tutorial")
    args = tut.ModelArgs(dropout=0.0)
    model = tut.make_model(args)
    x, y = tut.data(args)
    loss = tut.tokenwise_loss(args)
    with torch.no_grad():
        ref = [loss(model(xm), ym).item()
               for xm, ym in zip(x.chunk(tut.MICROBATCHES), y.chunk(tut.MICROBATCHES),
                                 strict=True)]
    torch.testing.assert_close(losses, ref, rtol=1e-5, atol=1e-6)

"""ringrun forwards each worker's output a whole line at a time, as torchrun's ``--tee`` does.

Several ranks printing at once must never mix inside a line, on the console and in the
``--log-dir`` files, with or without the rank prefix; the prefix is torch's, checked against
torchrun itself run on the same script; a line without its newline (a prompt, a progress bar)
still shows before the worker writes the rest of it. Workers are tiny scripts without torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ringtorch.testing import wait_for
from ringtorch.testing.harness import job_port

# Each rank prints 2,000 lines of 200 characters, each character its rank, as fast as it
# can, and each line in four writes (``python -u``: print writes each argument, the space and
# the newline separately), the way ``print(rank, tensor)`` did when two ranks' halves of a
# line were once seen glued together.
MANY_LINES = r"""
import os
c = os.environ["RANK"]
for _ in range(2000):
    print(c * 100, c * 99)
print(c * 100, c * 99, file=__import__("sys").stderr)
"""

LINES, WORLD = 2000, 4


def ringrun(args: list[str], env: dict[str, str] | None = None, timeout: float = 120,
            **kwargs) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "ringtorch.launcher", *args], env=full_env,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def expected_line(rank: int, prefix: str = "") -> str:
    return prefix + str(rank) * 100 + " " + str(rank) * 99


def check_whole_lines(text: str, prefixes: dict[int, str], count: int) -> None:
    """Every line of ``text`` is one rank's whole line, and each rank's are all there."""
    seen = {rank: 0 for rank in prefixes}
    wanted = {expected_line(rank, prefix): rank for rank, prefix in prefixes.items()}
    for number, line in enumerate(text.splitlines()):
        assert line in wanted, f"line {number} is not one rank's whole line: {line!r}"
        seen[wanted[line]] += 1
    assert seen == {rank: count for rank in prefixes}


@pytest.mark.parametrize("tee", [False, True], ids=["console", "tee-and-log-dir"])
def test_lines_of_ranks_printing_at_once_never_mix(tmp_path: Path, tee: bool) -> None:
    script = tmp_path / "many.py"
    script.write_text(MANY_LINES)
    logs = tmp_path / "logs"
    flags = ["--tee", "3", "--log-dir", str(logs), "--rdzv-id", "lines"] if tee else []
    result = ringrun(["--nproc-per-node", str(WORLD), *flags, str(script)])
    assert result.returncode == 0, result.stderr[-3000:]
    prefixes = {r: f"[default{r}]:" if tee else "" for r in range(WORLD)}
    check_whole_lines(result.stdout, prefixes, LINES)
    worker_err = "\n".join(line for line in result.stderr.splitlines()
                           if not line.startswith(("ringrun:", "*", "Setting OMP", "  ")))
    check_whole_lines(worker_err, prefixes, 1)
    if tee:
        (run_dir,) = logs.iterdir()
        for rank in range(WORLD):
            log = (run_dir / "attempt_0" / str(rank) / "stdout.log").read_text()
            check_whole_lines(log, {rank: ""}, LINES)


def torchrun_and_ringrun(tmp_path: Path, args: list[str], env: dict[str, str]) -> tuple[
        list[str], list[str]]:
    """The sorted stdout lines of torchrun and of ringrun running the same command."""
    script = tmp_path / "hello.py"
    script.write_text('import os\nprint("hello from", os.environ["RANK"])\nprint()\n'
                      'print("bye", flush=True)\n')
    full_env = {**os.environ, **env}
    torch_run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--master-port", str(job_port()),
         *args, str(script)], env=full_env, capture_output=True, text=True, timeout=120)
    assert torch_run.returncode == 0, torch_run.stderr[-3000:]
    ours = ringrun([*args, str(script)], env=env)
    assert ours.returncode == 0, ours.stderr[-3000:]
    return sorted(torch_run.stdout.splitlines()), sorted(ours.stdout.splitlines())


def test_the_tee_prefix_is_torchruns(tmp_path: Path) -> None:
    theirs, ours = torchrun_and_ringrun(
        tmp_path, ["--nproc-per-node", "2", "--tee", "1", "--role", "trainer"], {})
    assert "[trainer1]:hello from 1" in theirs  # what torch's own lines look like
    assert ours == theirs


def test_the_prefix_template_is_torchruns(tmp_path: Path) -> None:
    theirs, ours = torchrun_and_ringrun(
        tmp_path, ["--nproc-per-node", "2", "--tee", "3"],
        {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "${role_name}/${rank}:${local_rank} $x|"})
    assert "default/1:1 $x|hello from 1" in theirs
    assert ours == theirs


PROMPT = r"""
import os, sys
sys.stdout.write("name? ")
os.close(os.open(os.environ["GO_FILE"] + ".asked", os.O_RDONLY | os.O_CREAT))
with open(os.environ["GO_FILE"]) as answer:  # a FIFO: blocks until the test writes to it
    print("hello " + answer.read())
"""


def test_a_line_without_its_newline_shows_before_the_rest_of_it_comes(tmp_path: Path) -> None:
    """A prompt (no newline, then the worker waits) reaches the console within seconds (it
    shows after half a second) and the rest of its line continues it."""
    script, go = tmp_path / "prompt.py", tmp_path / "go"
    script.write_text(PROMPT)
    os.mkfifo(go)
    out = tmp_path / "stdout"
    env = {**os.environ, "GO_FILE": str(go)}
    with open(out, "wb") as stdout:
        proc = subprocess.Popen([sys.executable, "-m", "ringtorch.launcher", "--tee", "1",
                                 str(script)], env=env, stdout=stdout, stderr=subprocess.PIPE)
    try:
        wait_for((tmp_path / "go.asked").exists, timeout=30, what="the worker's prompt")
        # the worker waits for the answer: the prompt can only come as a partial line
        wait_for(lambda: out.read_bytes() == b"[default0]:name? ", timeout=3,
                 what="the prompt on the console")
        go.write_text("Ada")
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
    assert out.read_bytes() == b"[default0]:name? hello Ada\n"

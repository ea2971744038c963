"""``ringtorch.multiprocessing.spawn`` and ``start_processes`` behave as torch's do.

The child functions live at module level (spawn pickles them by name) and never import torch.
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import ringtorch.multiprocessing as mp
from ringtorch.testing import wait_for


def write_index_and_args(i: int, out: str, tag: str) -> None:
    Path(out, f"child{i}").write_text(f"{tag} {os.getpid()}")


def raise_on_one(i: int, out: str) -> None:
    if i == 1:
        wait_for(lambda: len(list(Path(out).glob("pid*"))) >= 2, 60,
                 "the other children's pid files")
        raise ValueError(f"bad input on {i}")
    Path(out, f".pid{i}").write_text(str(os.getpid()))  # whole before the others can see it
    Path(out, f".pid{i}").rename(Path(out, f"pid{i}"))
    time.sleep(600)


def kill_self(i: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def exit_three(i: int) -> None:
    sys.exit(3)


def sleep_briefly(i: int, seconds: float) -> None:
    time.sleep(seconds)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_spawn_calls_fn_with_the_index_and_args(tmp_path: Path) -> None:
    assert mp.spawn(write_index_and_args, args=(str(tmp_path), "hello"), nprocs=3) is None
    texts = {p.name: p.read_text().split()[0] for p in tmp_path.iterdir()}
    assert texts == {"child0": "hello", "child1": "hello", "child2": "hello"}


def test_the_first_exception_is_raised_in_the_parent_with_the_childs_traceback(
        tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(mp.ProcessRaisedException) as info:
        mp.spawn(raise_on_one, args=(str(tmp_path),), nprocs=3)
    assert time.monotonic() - started < 60.0  # not the 600 s the others would sleep
    exc = info.value
    assert exc.error_index == 1
    assert str(exc).startswith("\n\n-- Process 1 terminated with the following error:\n"
                               "Traceback (most recent call last):\n")
    assert 'raise ValueError(f"bad input on {i}")' in str(exc)
    assert str(exc).endswith("ValueError: bad input on 1\n")
    for rank in (0, 2):  # the other children were terminated
        assert not alive(int((tmp_path / f"pid{rank}").read_text()))


def test_a_child_killed_by_a_signal_gives_process_exited_exception() -> None:
    with pytest.raises(mp.ProcessExitedException,
                       match=r"^process 0 terminated with signal SIGKILL$") as info:
        mp.spawn(kill_self, nprocs=1)
    assert (info.value.exit_code, info.value.signal_name) == (-signal.SIGKILL, "SIGKILL")


def test_a_child_exiting_non_zero_gives_its_exit_code() -> None:
    with pytest.raises(mp.ProcessExitedException,
                       match=r"^process 0 terminated with exit code 3$") as info:
        mp.spawn(exit_three, nprocs=1)
    assert info.value.exit_code == 3 and info.value.signal_name is None


def test_join_false_returns_a_context_to_join() -> None:
    context = mp.spawn(sleep_briefly, args=(0.2,), nprocs=2, join=False)
    assert isinstance(context, mp.ProcessContext)
    assert len(context.pids()) == 2 and all(pid > 0 for pid in context.pids())
    assert context.join(timeout=0.01) is False
    while not context.join():  # torch's own idiom: join() blocks until a process ends
        pass
    assert [p.exitcode for p in context.processes] == [0, 0]


def test_start_processes_takes_any_start_method(tmp_path: Path) -> None:
    mp.start_processes(write_index_and_args, args=(str(tmp_path), "forked"), nprocs=2,
                       start_method="fork")
    assert sorted(p.read_text().split()[0] for p in tmp_path.iterdir()) == ["forked"] * 2


def test_spawn_with_another_start_method_warns_and_spawns(tmp_path: Path) -> None:
    with pytest.warns(FutureWarning, match="This method only supports start_method=spawn"):
        mp.spawn(write_index_and_args, args=(str(tmp_path), "x"), start_method="fork")
    # nprocs defaults to 1: one child, index 0, which ran with the args in its own process
    assert [p.name for p in tmp_path.iterdir()] == ["child0"]
    tag, pid = (tmp_path / "child0").read_text().split()
    assert tag == "x" and int(pid) != os.getpid()


def test_exceptions_survive_pickling() -> None:
    raised = pickle.loads(pickle.dumps(mp.ProcessRaisedException("msg", 1, 99)))
    assert (type(raised), str(raised), raised.error_index, raised.error_pid) == (
        mp.ProcessRaisedException, "msg", 1, 99)
    exited = pickle.loads(pickle.dumps(mp.ProcessExitedException("m", 2, 7, -9, "SIGKILL")))
    assert (exited.exit_code, exited.signal_name, exited.error_index) == (-9, "SIGKILL", 2)


def test_children_die_with_their_parent(tmp_path: Path) -> None:
    program = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import ringtorch.multiprocessing as mp
        import test_spawn
        if __name__ == "__main__":
            context = mp.spawn(test_spawn.sleep_briefly, args=(600,), nprocs=2, join=False)
            print(" ".join(map(str, context.pids())), flush=True)
            time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE, text=True)
    children = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(children) == 2
    parent.kill()
    parent.wait()
    parent.stdout.close()
    wait_for(lambda: not any(alive(pid) for pid in children), 30, "the children to die")


def test_the_module_has_the_standard_multiprocessing_names() -> None:
    assert mp.Process is not None and mp.Queue is not None and mp.get_context is not None
    assert {"spawn", "start_processes", "ProcessContext"} <= set(mp.__all__)

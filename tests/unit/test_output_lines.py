"""How a worker's bytes are framed for the console (output.frame_lines): each line behind the
prefix, a line already open on the console continued in place, a partial line left open."""

from __future__ import annotations

import io
import os

import pytest

from ringtorch._workers.output import LineCopier, frame_lines
from ringtorch.testing import wait_for


@pytest.mark.parametrize(("data", "continuing", "framed"), [
    (b"a\nb\n", False, b"[r0]:a\n[r0]:b\n"),          # whole lines
    (b"a\nb", False, b"[r0]:a\n[r0]:b"),              # the last one partial: no newline added
    (b"name? ", False, b"[r0]:name? "),               # a prompt, shown as it is
    (b"Ada\n", True, b"Ada\n"),                       # the rest of the open line: no prefix
    (b"Ada\nnext", True, b"Ada\n[r0]:next"),
    (b"more", True, b"more"),
    (b"\n", False, b"[r0]:\n"),                       # an empty line is a line (as in torch)
    (b"\n", True, b"\n"),                             # ends the open line
    (b"\r 10%|#  |\r 20%|## |", False, b"[r0]:\r 10%|#  |\r 20%|## |"),  # \r: same line
    (b"\r 30%|###|\n", True, b"\r 30%|###|\n"),
])
def test_lines_are_framed_behind_the_prefix(data: bytes, continuing: bool,
                                            framed: bytes) -> None:
    assert frame_lines(data, b"[r0]:", continuing) == framed


def test_without_a_prefix_the_bytes_pass_unchanged() -> None:
    for data in (b"a\nb\n", b"a\nb", b"\r 10%", b"\n\n"):
        assert frame_lines(data, b"", False) == data
        assert frame_lines(data, b"", True) == data


def test_an_open_line_is_ended_before_another_workers_line_and_goes_on_behind_its_prefix(
) -> None:
    console = io.BytesIO()
    pipes = {}
    for name in ("a", "b"):
        read_fd, pipes[name] = os.pipe()
        LineCopier(console, f"[{name}]:".encode(), None).start(os.fdopen(read_fd, "rb"), name)
    os.write(pipes["a"], b"name? ")  # a prompt: shown without waiting for the rest
    wait_for(lambda: console.getvalue() == b"[a]:name? ", timeout=5, what="the prompt")
    os.write(pipes["a"], b"Ada")  # continues the open line in place
    wait_for(lambda: console.getvalue() == b"[a]:name? Ada", timeout=5, what="more of it")
    os.write(pipes["b"], b"a line of b\n")
    wait_for(lambda: console.getvalue() == b"[a]:name? Ada\n[b]:a line of b\n", timeout=5,
             what="b's line after a's open line was ended")
    os.write(pipes["a"], b" Lovelace\nbye")
    os.close(pipes["a"])  # the stream ends: its last line gets its newline
    os.close(pipes["b"])
    wait_for(lambda: console.getvalue().endswith(b"bye\n"), timeout=5, what="the end")
    assert console.getvalue() == b"[a]:name? Ada\n[b]:a line of b\n[a]: Lovelace\n[a]:bye\n"


def test_one_workers_two_streams_are_one_writer_as_on_a_terminal() -> None:
    """A progress bar on stderr, held back, then cleared by a line on stdout of the same
    worker: the bar comes first and the line continues it, as the worker's own terminal
    would show it (the line overwrites the bar); another worker's line would end it."""
    console, worker, fds = io.BytesIO(), object(), {}
    copiers = {}
    for name in ("out", "err"):
        read_fd, fds[name] = os.pipe()
        copiers[name] = LineCopier(console, b"[w0]:", None, worker)
        copiers[name].start(os.fdopen(read_fd, "rb"), name)
    os.write(fds["err"], b"\r 50%|#  |")
    wait_for(lambda: copiers["err"]._held, timeout=5, what="the bar read and held back")
    os.write(fds["out"], b"\repoch 1 done\n")
    wait_for(lambda: console.getvalue().endswith(b"done\n"), timeout=5, what="the line")
    assert console.getvalue() == b"[w0]:\r 50%|#  |\repoch 1 done\n"
    os.close(fds["out"])
    os.close(fds["err"])
    assert copiers["out"].join(5) and copiers["err"].join(5)


def test_streams_sent_to_two_files_never_break_each_others_lines() -> None:
    out, err, worker, fds, copiers = io.BytesIO(), io.BytesIO(), object(), {}, {}
    for name, console in (("out", out), ("err", err)):
        read_fd, fds[name] = os.pipe()
        copiers[name] = LineCopier(console, b"[w0]:", None, worker)
        copiers[name].start(os.fdopen(read_fd, "rb"), name)
    os.write(fds["err"], b"a warning in")
    wait_for(lambda: err.getvalue() == b"[w0]:a warning in", timeout=5, what="the held part")
    os.write(fds["out"], b"a line\n")
    wait_for(lambda: out.getvalue() == b"[w0]:a line\n", timeout=5, what="the stdout line")
    os.write(fds["err"], b" two writes\n")
    os.close(fds["out"])
    os.close(fds["err"])
    assert copiers["out"].join(5) and copiers["err"].join(5)
    assert err.getvalue() == b"[w0]:a warning in two writes\n"
    assert out.getvalue() == b"[w0]:a line\n"

"""How a worker's bytes are framed for the console (output.frame_lines): each line behind the
prefix, a line already open on the console continued in place, a partial line left open."""

from __future__ import annotations

import pytest

from ringtorch._workers.output import frame_lines


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

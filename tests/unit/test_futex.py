"""futex.py: a sleeper on a shared word is woken by the writer, across processes, long before
its timeout; a word that already changed does not put anyone to sleep."""

from __future__ import annotations

import mmap
import multiprocessing
import os
import struct
import threading
import time

from ringtorch._wire import futex
from ringtorch.testing import wait_for

LONG = 60.0  # a sleep that would fail the test (its 120 s timeout is not reached by joins below)


def test_futex_is_available_on_this_linux_x86_64_machine() -> None:
    assert futex.available


def test_a_word_that_changed_already_does_not_sleep() -> None:
    area = mmap.mmap(-1, 4096)
    struct.pack_into("<I", area, 0, 7)
    done = threading.Event()

    def sleeper() -> None:
        futex.wait(futex.address_of(memoryview(area), 0), 6, LONG)  # expects 6, finds 7
        done.set()

    threading.Thread(target=sleeper, daemon=True).start()
    assert done.wait(10.0), "futex.wait slept although the word had changed"


def _sleep_on(area: mmap.mmap, expected: int, out: multiprocessing.Queue) -> None:
    out.put("sleeping")
    while struct.unpack_from("<I", area, 0)[0] == expected:
        futex.wait(futex.address_of(memoryview(area), 0), expected, LONG)
    out.put(struct.unpack_from("<I", area, 0)[0])


_FUTEX_SYSCALL = {"x86_64": "202", "aarch64": "98"}.get(os.uname().machine, "202")


def _in_futex_wait(pid: int, addr: int) -> bool:
    """Whether process ``pid`` is inside the futex system call on ``addr`` (/proc says so)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
    except OSError:
        return False
    return fields[:2] == [_FUTEX_SYSCALL, hex(addr)]


def test_another_process_sleeping_on_a_shared_word_is_woken_by_the_writer() -> None:
    area = mmap.mmap(-1, 4096)  # MAP_SHARED|MAP_ANONYMOUS: shared with the forked child
    struct.pack_into("<I", area, 0, 1)
    out: multiprocessing.Queue = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_sleep_on, args=(area, 1, out))
    child.start()
    try:
        assert out.get(timeout=30) == "sleeping"
        addr = futex.address_of(memoryview(area), 0)
        wait_for(lambda: _in_futex_wait(child.pid, addr), what="the child to sleep on the word")
        struct.pack_into("<I", area, 0, 2)
        futex.wake(futex.address_of(memoryview(area), 0))
        assert out.get(timeout=10) == 2  # woken, not timed out after 60 s
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()


def test_a_sleeper_nobody_wakes_sleeps_until_its_timeout() -> None:
    area = mmap.mmap(-1, 4096)
    struct.pack_into("<I", area, 0, 5)
    started = time.monotonic()
    futex.wait(futex.address_of(memoryview(area), 0), 5, 0.2)
    assert time.monotonic() - started >= 0.15  # it slept (a failing syscall would return at once)

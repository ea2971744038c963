"""Shared-memory segments (ringtorch/_wire/shm.py): private files, one memory for every
mapping, the owner's lock as its pulse, growth, and the sweep of segments whose creator died.

Creators that must die run in forked children, killed with SIGKILL like a crashed rank.
"""

from __future__ import annotations

import os
import resource
import signal
import stat
import time

import pytest

from ringtorch._wire.shm import (
    NAME_PREFIX,
    SHM_DIR,
    TMP_PREFIX,
    Segment,
    shm_supported,
    sweep_stale_segments,
)
from ringtorch.testing import wait_for

_kept: list[object] = []  # what a forked child must keep alive until it is killed


def _in_child(body, *, keep_running: bool = True) -> tuple[int, str]:
    """Fork a child that runs ``body()`` (returning a string it reports), then sleeps until
    killed (30 s at most); returns (pid, report)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.write(w, body().encode() + b"\n")
            os.close(w)
            if keep_running:
                time.sleep(30)  # killed long before
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        report = f.readline().strip()
    return pid, report


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _new_segment() -> str:
    seg = Segment.create(4096)
    _kept.append(seg)
    return seg.name


def test_this_machine_supports_the_shared_memory_protocol():
    assert shm_supported() == ""


def test_a_segment_is_a_private_file_with_a_random_name():
    seg = Segment.create(10_000)
    try:
        st = os.stat(os.path.join(SHM_DIR, seg.name))
        assert stat.S_IMODE(st.st_mode) == 0o600
        assert seg.name.startswith(f"{NAME_PREFIX}{os.getpid()}_")
        assert len(seg.name.rsplit("_", 1)[1]) == 32  # 128 random bits, hex
        assert seg.size == st.st_size == 12_288  # whole pages
    finally:
        seg.close()
    assert not os.path.exists(os.path.join(SHM_DIR, seg.name))


def test_every_mapping_sees_the_same_memory_even_after_the_name_is_gone():
    owner = Segment.create(4096)
    peer = Segment.attach(owner.name)
    owner.unlink()
    assert not os.path.exists(os.path.join(SHM_DIR, owner.name))
    owner.buf[100:105] = b"hello"
    assert bytes(peer.buf[100:105]) == b"hello"
    peer.close()
    owner.close()


def test_attach_refuses_names_that_are_not_ringtorch_segments():
    with pytest.raises(ValueError, match=r"^'psm_1234' is not a ringtorch shared-memory segment name$"):
        Segment.attach("psm_1234")
    with pytest.raises(ValueError, match="is not a ringtorch shared-memory segment name"):
        Segment.attach(f"{NAME_PREFIX}x/../../etc/passwd")


def test_attach_refuses_a_segment_of_another_user():
    seg = Segment.create(4096)
    try:
        os.chown(os.path.join(SHM_DIR, seg.name), 4242, -1)
        with pytest.raises(PermissionError, match=r"belongs to uid 4242, not to this process's "
                                                  r"uid \d+; refusing to map it$"):
            Segment.attach(seg.name)
    finally:
        seg.close()


def test_the_owner_is_alive_until_it_is_killed_even_before_it_is_reaped():
    pid, name = _in_child(_new_segment)
    peer = Segment.attach(name)
    try:
        assert peer.owner_alive()
        os.kill(pid, signal.SIGKILL)
        # the child is a zombie now: its lock is gone already
        wait_for(lambda: not peer.owner_alive(), 5.0, "the peer's owner to be seen dead")
        os.waitpid(pid, 0)
        assert not peer.owner_alive()
    finally:
        _kill(pid)
        peer.close()
        os.unlink(os.path.join(SHM_DIR, name))


def test_a_child_forked_by_the_owner_does_not_keep_the_owner_alive():
    def owner_with_child() -> str:
        name = _new_segment()
        grandchild = os.fork()
        if grandchild == 0:
            time.sleep(10)
            os._exit(0)
        return f"{name} {grandchild}"

    pid, report = _in_child(owner_with_child)
    name, grandchild = report.split()
    peer = Segment.attach(name)
    try:
        _kill(pid)
        wait_for(lambda: not peer.owner_alive(), 5.0, "the peer's owner to be seen dead")
    finally:
        _kill(pid)
        os.kill(int(grandchild), signal.SIGKILL)
        peer.close()
        os.unlink(os.path.join(SHM_DIR, name))


def test_growth_keeps_the_content_and_peers_map_the_new_size():
    owner = Segment.create(4096)
    peer = Segment.attach(owner.name)
    owner.buf[0:3] = b"abc"
    assert owner.grow(50_000)
    owner.buf[40_000:40_003] = b"xyz"
    assert (owner.size, peer.size) == (53_248, 4096)
    peer.remap()
    assert peer.size == 53_248
    assert bytes(peer.buf[0:3]) == b"abc" and bytes(peer.buf[40_000:40_003]) == b"xyz"
    peer.close()
    owner.close()


def test_growth_that_cannot_get_the_memory_keeps_the_old_size():
    def grow_beyond_the_limit() -> str:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        seg = Segment.create(8192)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16_384, 16_384))
        grown = seg.grow(1 << 20)
        size, on_disk = seg.size, os.fstat(seg._fd).st_size
        seg.close()
        return f"{grown} {size} {on_disk}"

    pid, report = _in_child(grow_beyond_the_limit, keep_running=False)
    os.waitpid(pid, 0)
    assert report == "False 8192 8192"


def test_the_sweep_removes_segments_whose_creator_died_at_once_and_keeps_live_ones():
    dead_pid, dead_name = _in_child(_new_segment)
    _kill(dead_pid)
    live = Segment.create(4096)
    try:
        removed = sweep_stale_segments()  # a segment name is locked all its creator's life
        assert dead_name in removed and live.name not in removed
        assert not os.path.exists(os.path.join(SHM_DIR, dead_name))
        assert os.path.exists(os.path.join(SHM_DIR, live.name))
    finally:
        live.close()


def test_a_segment_name_appears_only_once_locked_and_full_size():
    before = set(os.listdir(SHM_DIR))
    seg = Segment.create(3 * 4096)
    try:
        made = {n for n in set(os.listdir(SHM_DIR)) - before if n.startswith(NAME_PREFIX)}
        assert made == {seg.name}
        assert not [n for n in os.listdir(SHM_DIR) if n.startswith(f"{TMP_PREFIX}{os.getpid()}_")]
        assert os.stat(os.path.join(SHM_DIR, seg.name)).st_size == 3 * 4096
    finally:
        seg.close()


def _temporary(pid: int) -> str:
    name = f"{TMP_PREFIX}{pid}_0123456789abcdef"
    fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.close(fd)
    return name


def test_the_sweep_keeps_a_young_temporary_name_of_a_live_creator_only():
    dead_pid, _ = _in_child(lambda: "")
    _kill(dead_pid)
    of_the_living, of_the_dead = _temporary(os.getpid()), _temporary(dead_pid)
    try:
        removed = sweep_stale_segments(min_age_s=60)
        assert of_the_dead in removed and of_the_living not in removed
        assert of_the_living in sweep_stale_segments(min_age_s=0)  # too old to be in the making
    finally:
        for name in (of_the_living, of_the_dead):
            if os.path.exists(os.path.join(SHM_DIR, name)):
                os.unlink(os.path.join(SHM_DIR, name))

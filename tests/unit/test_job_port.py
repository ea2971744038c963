"""job_port draws a job's port below the kernel's ephemeral range, and under pytest-xdist from
the worker's own slice of it, so that two tests running at once never draw the same port."""

from __future__ import annotations

import pytest

from ringtorch.testing.harness import job_port, job_port_range


def _ephemeral_start() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def test_outside_xdist_the_range_is_everything_below_the_ephemeral_ports(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    assert job_port_range() == (20000, _ephemeral_start())


def test_two_xdist_workers_draw_from_halves_that_do_not_meet(
        monkeypatch: pytest.MonkeyPatch) -> None:
    low, high = 20000, _ephemeral_start()
    half = (high - low) // 2
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    drawn = {}
    for index in (0, 1):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{index}")
        assert job_port_range() == (low + index * half, low + (index + 1) * half)
        drawn[index] = {job_port() for _ in range(200)}
        assert all(low + index * half <= port < low + (index + 1) * half
                   for port in drawn[index]), sorted(drawn[index])
    assert max(drawn[0]) < min(drawn[1])


@pytest.mark.parametrize("worker, count", [("gw0", "1"), ("master", "2"), ("gw", "2"),
                                           ("gw3", "2"), ("gw0", "")])
def test_anything_but_one_of_several_workers_keeps_the_whole_range(
        monkeypatch: pytest.MonkeyPatch, worker: str, count: str) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", count)
    assert job_port_range() == (20000, _ephemeral_start())

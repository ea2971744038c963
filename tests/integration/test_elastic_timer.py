"""``elastic.timer``: a worker that overruns ``expires(after=...)`` is killed by the timer
server, one that finishes in time is not; the file-based server works across processes (and
with torch's client or server on the other end) and kills itself after a worker, as torch's
does; errors carry torch's messages. Each behaviour runs against torch's own timer too."""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import _timer_workers as W

# long (each test waits out real expiry timers: 55 s): in the slow stage, not the default suite
pytestmark = pytest.mark.slow

OURS, TORCH = "ringtorch.distributed.elastic.timer", "torch.distributed.elastic.timer"
WORKERS = Path(W.__file__)
ROOT = WORKERS.parents[2]


def _import(package: str) -> Any:
    return importlib.import_module(package)


@pytest.fixture
def timer_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """caplog, also for torch's loggers (torch's do not propagate to the root logger)."""
    loggers = [logging.getLogger(f"{package}.api") for package in (OURS, TORCH)]
    for logger in loggers:
        caplog.set_level("INFO", logger=logger.name)
        logger.addHandler(caplog.handler)
    yield caplog
    for logger in loggers:
        logger.removeHandler(caplog.handler)


def _local_server(package: str) -> tuple[Any, Any]:
    queue = multiprocessing.get_context("spawn").Queue()
    server = _import(package).LocalTimerServer(queue, max_interval=0.05)
    server.start()
    return queue, server


@pytest.mark.parametrize("package", [OURS, TORCH])
def test_local_server_kills_a_worker_that_overruns_its_timer(
        package: str, tmp_path: Path, timer_logs: pytest.LogCaptureFixture) -> None:
    queue, server = _local_server(package)
    marker = tmp_path / "inside"
    worker = multiprocessing.get_context("spawn").Process(
        target=W.overrun, args=(package, queue, 0.5, str(marker)))
    try:
        worker.start()
        worker.join(60)  # it sleeps 120 s inside the block: only the server ends it early
    finally:
        server.stop()
        if worker.is_alive():
            worker.kill()
    assert marker.exists()
    assert worker.exitcode == -signal.SIGKILL
    messages = [record.getMessage() for record in timer_logs.records]
    assert f"Reaping worker_id=[{worker.pid}]. Expired timers: ['overrun']" in messages
    assert f"Successfully reaped worker=[{worker.pid}]" in messages


@pytest.mark.parametrize("package", [OURS, TORCH])
def test_local_server_spares_a_worker_that_finishes_in_time(
        package: str, timer_logs: pytest.LogCaptureFixture) -> None:
    queue, server = _local_server(package)
    worker = multiprocessing.get_context("spawn").Process(target=W.in_time,
                                                          args=(package, queue, 0.5))
    try:
        worker.start()
        worker.join(60)
    finally:
        server.stop()
    assert worker.exitcode == 0
    assert not [r for r in timer_logs.records if r.getMessage().startswith("Reaping")]


def _start_file_server(package: str, pipe: Path) -> subprocess.Popen[str]:
    server = subprocess.Popen([sys.executable, str(WORKERS), "server", package, str(pipe)],
                              cwd=ROOT, env={**os.environ, "LOGLEVEL": "INFO"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline() == "ready\n"
    return server


def _start_file_worker(package: str, pipe: Path, sig: int, after: float,
                       work: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(WORKERS), package, str(pipe), str(sig),
                             str(after), str(work)], cwd=ROOT, stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize(("server_package", "client_package"),
                         [(OURS, OURS), (TORCH, OURS), (OURS, TORCH)])
def test_file_server_kills_an_overrunning_worker_then_itself_with_its_signal(
        server_package: str, client_package: str, tmp_path: Path) -> None:
    pipe = tmp_path / "timer.pipe"
    server = _start_file_server(server_package, pipe)
    worker = _start_file_worker(client_package, pipe, signal.SIGTERM, after=0.5, work=120)
    try:
        worker_code = worker.wait(60)
        _, server_log = server.communicate(timeout=60)
    finally:
        for proc in (worker, server):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert worker_code == -signal.SIGTERM
    assert server.returncode == -signal.SIGTERM  # torch's server signals its own process too
    # torch's handler prefixes its own header to each line; the messages are the same
    messages = [re.sub(r"^[DIWE]\d{4} [\d:.]+ \d+ \S+:\d+\] ", "", line)
                for line in server_log.splitlines()]
    assert f"Reaping worker_pid=[{worker.pid}]. Expired timers: ['file_block']" in messages
    assert f"Successfully reaped worker=[{worker.pid}] with signal=15" in messages
    assert (f"Terminating the server process=[{server.pid}] because of expired timers"
            in messages), server_log


@pytest.mark.parametrize("package", [OURS, TORCH])
def test_file_server_spares_a_worker_that_finishes_in_time(package: str,
                                                           tmp_path: Path) -> None:
    pipe = tmp_path / "timer.pipe"
    server = _start_file_server(package, pipe)
    worker = _start_file_worker(package, pipe, signal.SIGKILL, after=1.0, work=0)
    try:
        worker_code = worker.wait(60)  # it outlives its timer's deadline by a second
        still_running = server.poll() is None
    finally:
        server.kill()
        _, server_log = server.communicate()
    assert worker_code == 0
    assert still_running
    assert "Reaping" not in server_log


def _error(fn: Callable[[], object]) -> tuple[type, str]:
    try:
        fn()
    except Exception as exc:
        return type(exc), str(exc)
    raise AssertionError("no error")


def test_file_client_without_a_server_fails_as_torchs(tmp_path: Path) -> None:
    pipe = str(tmp_path / "nobody.pipe")
    ours = _error(lambda: _import(OURS).FileTimerClient(pipe).acquire("s", 1.0))
    theirs = _error(lambda: _import(TORCH).FileTimerClient(pipe).acquire("s", 1.0))
    assert ours == theirs == (BrokenPipeError, "Could not send the FileTimerRequest because "
                                               "FileTimerServer is not available.")


def test_file_client_refuses_a_request_longer_than_pipe_buf_as_torchs(tmp_path: Path) -> None:
    pipe = tmp_path / "reader.pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so that opens succeed
    try:
        scope = "s" * select.PIPE_BUF
        ours = _error(lambda: _import(OURS).FileTimerClient(str(pipe)).acquire(scope, 5.0))
        theirs = _error(lambda: _import(TORCH).FileTimerClient(str(pipe)).acquire(scope, 5.0))
    finally:
        os.close(reader)
    request = _import(TORCH).FileTimerRequest(os.getpid(), scope, 5.0, signal.SIGKILL)
    assert ours == theirs == (RuntimeError, f"FileTimerRequest larger than {select.PIPE_BUF} "
                                            f"bytes is not supported: {request.to_json()}")


def test_expires_without_a_configured_client_fails_as_torchs() -> None:
    program = ("import sys, importlib\n"
               "timer = importlib.import_module(sys.argv[1])\n"
               "try:\n"
               "    with timer.expires(after=1):\n"
               "        pass\n"
               "except RuntimeError as exc:\n"
               "    print(exc)\n")
    outputs = [subprocess.run([sys.executable, "-c", program, package], capture_output=True,
                              text=True, timeout=60).stdout for package in (OURS, TORCH)]
    assert outputs == ["Configure timer client before using countdown timers.\n"] * 2


def test_file_requests_are_torchs_json_lines() -> None:
    ours = _import(OURS).FileTimerRequest(123, "scope", 4.5, signal.SIGTERM)
    theirs = _import(TORCH).FileTimerRequest(123, "scope", 4.5, signal.SIGTERM)
    assert ours.to_json() == theirs.to_json()
    assert ours == _import(OURS).FileTimerRequest(123, "scope", 4.5, signal.SIGTERM)
    assert ours != _import(OURS).FileTimerRequest(123, "scope", 4.5, signal.SIGKILL)


def test_expires_releases_its_scope_when_the_block_raises() -> None:
    record: list[tuple[str, str]] = []
    timer = _import(OURS)

    class Recorder(timer.TimerClient):
        def acquire(self, scope_id: str, expiration_time: float) -> None:
            record.append(("acquire", scope_id))

        def release(self, scope_id: str) -> None:
            record.append(("release", scope_id))

    before = time.time()
    with pytest.raises(ValueError, match="^inside$"), timer.expires(
            after=5, scope="block", client=Recorder()):
        raise ValueError("inside")
    assert record == [("acquire", "block"), ("release", "block")]
    assert time.time() >= before
    with timer.expires(after=5, client=Recorder()):
        line = sys._getframe().f_lineno - 1
    assert record[-1] == ("release", f"{__file__}#{line}")  # unnamed: the caller's line


def test_the_elastic_helpers_program_in_the_docs_runs(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "api.md").read_text()
    section = text[text.index("## Elastic helpers"):]
    program = re.search(r"```python\n(.*?)```", section, re.S)
    assert program, "docs/api.md has no program under Elastic helpers"
    script = tmp_path / "elastic_helpers.py"
    script.write_text(program.group(1))
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "exit codes: [-9, 0]" in result.stdout
    assert result.stdout.endswith("elastic helpers: all checks passed\n"), result.stdout


def _run_once_record(package: str, directory: Path) -> tuple[list[tuple[str, str | None]], int,
                                                            list[tuple[int, str]]]:
    timer = _import(package)
    pipe = str(directory / f"{package}.pipe")
    events: list[tuple[str, str | None]] = []
    server = timer.FileTimerServer(pipe, "run", max_interval=0.2, log_event=lambda name, req:
                                   events.append((name, None if req is None else req.scope_id)))
    server.start()
    client = timer.FileTimerClient(pipe, signal=0)  # expired, but with no signal to reap it
    client.acquire("expired", time.time() - 1)
    client.acquire("released", time.time() + 100)
    client.release("released")
    server.run_once()
    return events, server._request_count, sorted(server._timers)


def test_file_server_run_once_events_and_unsignalled_timers_as_torchs(tmp_path: Path) -> None:
    ours, theirs = _run_once_record(OURS, tmp_path), _run_once_record(TORCH, tmp_path)
    # the expired timer had no signal: reported, its worker (this process) left alone, and
    # its timers dropped all the same
    assert ours == theirs == ([("watchdog started", None), ("timer expired", "expired")], 3, [])

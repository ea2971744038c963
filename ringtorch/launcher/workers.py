"""The local worker group of one rendezvous round: environment, start, watch, stop.

:func:`worker_env` is the torchrun environment contract, as a pure function of the round's
:class:`Assignment`. :class:`LocalWorkerGroup` starts one process per local rank with that
environment, routes its output (console, ``--tee`` prefixes, ``--log-dir`` files), watches
exits as they happen and remembers each failure with its exit time, so that the summary can
name the first one.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from string import Template
from typing import IO

from ringtorch import _config
from ringtorch._workers import (
    ERROR_FILE_ENV,
    JOB_MARK_VAR,
    ForkedWorker,
    Guardian,
    LineCopier,
    ProcessFailure,
    WorkerProcess,
    route_stream,
    stop_processes,
    wait_any,
)
from ringtorch.launcher import trace_merge
from ringtorch.launcher.config import LOCAL_RANK_MACRO, LaunchConfig, Std, std_for

# torch's TailLog header, f"[{role}{local_rank}]:" (e.g. "[default0]:").
DEFAULT_PREFIX_TEMPLATE = "[${role_name}${local_rank}]:"


@dataclass(frozen=True)
class Assignment:
    """This node's place in one rendezvous round."""

    round: int
    group_rank: int
    group_world_size: int
    base_global_rank: int
    world_size: int
    master_addr: str
    master_port: int


@dataclass(frozen=True)
class WorkerFailure:
    """One worker that exited non-zero or was killed, as first observed."""

    global_rank: int
    local_rank: int
    pid: int
    exitcode: int
    exited_at: float
    detail: ProcessFailure


def worker_env(base: Mapping[str, str], config: LaunchConfig, assignment: Assignment,
               local_rank: int, restart_count: int, error_file: str) -> dict[str, str]:
    """The environment of local rank ``local_rank``: ``base`` plus torchrun's variables."""
    rank = assignment.base_global_rank + local_rank
    env = dict(base)
    env.update({
        "RANK": str(rank),
        "GROUP_RANK": str(assignment.group_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": config.role,
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
        "WORLD_SIZE": str(assignment.world_size),
        "GROUP_WORLD_SIZE": str(assignment.group_world_size),
        "ROLE_WORLD_SIZE": str(assignment.world_size),
        "MASTER_ADDR": assignment.master_addr,
        "MASTER_PORT": str(assignment.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
        "TORCHELASTIC_RUN_ID": config.run_id,
        # continue mode: node 0's agent serves the store (agent.py), so that rank 0 may die
        "TORCHELASTIC_USE_AGENT_STORE": str(config.keep_going),
        ERROR_FILE_ENV: error_file,
    })
    if config.secret:
        env["RINGTORCH_SECRET"] = config.secret
    if "OMP_NUM_THREADS" not in base and config.nproc_per_node > 1:
        env["OMP_NUM_THREADS"] = "1"
    if config.virtual_local_rank:
        visible = base.get("CUDA_VISIBLE_DEVICES")
        devices = visible.split(",") if visible else [str(i) for i in range(local_rank + 1)]
        env["LOCAL_RANK"] = "0"
        env["CUDA_VISIBLE_DEVICES"] = devices[local_rank % len(devices)]
    return env


def worker_argv(config: LaunchConfig, local_rank: int) -> list[str]:
    """The worker command line, with the local-rank macro substituted."""
    return [arg.replace(LOCAL_RANK_MACRO, str(local_rank)) for arg in config.argv]


def line_prefix(config: LaunchConfig, rank: int, local_rank: int) -> bytes:
    """The console prefix of a worker's lines (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE)."""
    template = config.log_line_prefix_template or DEFAULT_PREFIX_TEMPLATE
    text = Template(template).safe_substitute(role_name=config.role, rank=rank,
                                              local_rank=local_rank)
    return text.encode()


class LocalWorkerGroup:
    """The workers of this node for one round; start them from the main thread only."""

    def __init__(self, config: LaunchConfig, assignment: Assignment, restart_count: int,
                 attempt_dir: str, log_files: bool,
                 consoles: tuple[IO[bytes], IO[bytes]] | None = None,
                 guardian: Guardian | None = None) -> None:
        self.config = config
        self.assignment = assignment
        self.restart_count = restart_count
        self.attempt_dir = attempt_dir
        self.log_files = log_files
        self.consoles = consoles or (sys.stdout.buffer, sys.stderr.buffer)
        self.workers: list[WorkerProcess | ForkedWorker] = []
        self.failures: dict[int, WorkerFailure] = {}
        # failed workers restarted alone (--on-worker-failure=continue): (failure, restart)
        self.replaced: list[tuple[WorkerFailure, int]] = []
        self._error_files: list[str] = []
        self._copiers: list[tuple[int, LineCopier]] = []  # (local rank, copier)
        self._guardian = guardian
        # Where the workers drop what they see of themselves (flight records, stacks,
        # traces, statistics) for the launcher to merge: one folder per attempt.
        self.observe_dir = os.path.join(attempt_dir, "observe")
        os.makedirs(self.observe_dir, exist_ok=True)

    def start(self) -> None:
        """Start one worker per local rank (raises WorkerStartError if the program is missing)."""
        for local_rank in range(self.config.nproc_per_node):
            self.workers.append(self._start_one(local_rank))

    def restart_one(self, local_rank: int, restart_count: int) -> None:
        """Start a replacement for the failed worker of ``local_rank``, alone, the others
        untouched: it joins the running job (``RINGTORCH_JOIN=1``) as the same rank, and reads
        ``restart_count`` in TORCHELASTIC_RESTART_COUNT. Its failure moves to ``replaced``."""
        rank = self.assignment.base_global_rank + local_rank
        failure = self.failures.pop(rank)
        self.replaced.append((failure, restart_count))
        if self._guardian is not None:
            self._guardian.release(failure.pid)
        self.workers[local_rank] = self._start_one(local_rank, restart_count)

    def _start_one(self, local_rank: int,
                   replacing: int | None = None) -> WorkerProcess | ForkedWorker:
        """Start local rank ``local_rank``; ``replacing``: the restart count of a replacement
        that joins the running job."""
        rank = self.assignment.base_global_rank + local_rank
        rank_dir = os.path.join(self.attempt_dir, str(local_rank))
        if replacing is not None:  # its own files: the failed worker's stay for the summary
            rank_dir = os.path.join(rank_dir, f"restart_{replacing}")
        os.makedirs(rank_dir, exist_ok=True)
        error_file = os.path.join(rank_dir, "error.json")
        if local_rank < len(self._error_files):
            self._error_files[local_rank] = error_file
        else:
            self._error_files.append(error_file)
        env = worker_env(os.environ, self.config, self.assignment, local_rank,
                         self.restart_count if replacing is None else replacing, error_file)
        if replacing is not None:
            env[_config.JOIN.name] = "1"
        if self._guardian is not None:  # how the guardian finds what escaped the groups
            env[JOB_MARK_VAR] = self._guardian.mark
        env[_config.OBSERVE_DIR.name] = self.observe_dir
        env.update(trace_merge.worker_env(self.config))
        targets, copiers, key = [], [], object()  # key: this worker's two streams
        for stream, console, name in ((Std.OUT, self.consoles[0], "stdout"),
                                      (Std.ERR, self.consoles[1], "stderr")):
            redirect = bool(std_for(self.config.redirects, local_rank) & stream)
            tee = bool(std_for(self.config.tee, local_rank) & stream)
            shown = (self.config.local_ranks_filter is None
                     or local_rank in self.config.local_ranks_filter)
            to_file = (redirect or tee) and self.log_files
            log_path = os.path.join(rank_dir, f"{name}.log") if to_file else None
            prefix = line_prefix(self.config, rank, local_rank) if tee else None
            target, copier = route_stream(console, prefix, log_path, show=shown and not redirect,
                                          worker=key)
            targets.append(target)
            copiers.append((copier, name))
        try:
            worker: WorkerProcess | ForkedWorker
            if self.config.fork_target is not None:
                worker = ForkedWorker(self.config.fork_target, env, stdout=targets[0],
                                      stderr=targets[1])
            else:
                worker = WorkerProcess(worker_argv(self.config, local_rank), env,
                                       stdout=targets[0], stderr=targets[1])
        finally:
            for target in targets:
                if hasattr(target, "close"):
                    target.close()
        if self._guardian is not None:
            self._guardian.watch(worker.pid)
        pipes = worker.pipes()
        for (copier, name), pipe in zip(copiers, pipes, strict=True):
            if copier is not None and pipe is not None:
                copier.start(pipe, name=f"ringrun-{name}-{local_rank}")
                self._copiers.append((local_rank, copier))
        return worker

    def exit_codes(self) -> list[int | None]:
        """Each worker's exit code (None while it runs); records new failures."""
        codes = [worker.poll() for worker in self.workers]
        for local_rank, (worker, code) in enumerate(zip(self.workers, codes, strict=True)):
            rank = self.assignment.base_global_rank + local_rank
            if code not in (None, 0) and rank not in self.failures:
                error_file = self._error_files[local_rank]
                self.failures[rank] = WorkerFailure(
                    global_rank=rank, local_rank=local_rank, pid=worker.pid, exitcode=code,
                    exited_at=worker.exited_at or time.time(),
                    detail=ProcessFailure(local_rank, worker.pid, code, error_file))
        return codes

    def wait(self, timeout: float) -> None:
        """Block until a worker exits or ``timeout`` seconds pass."""
        wait_any(self.workers, timeout)

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 30.0,
             force: Callable[[], bool] = lambda: False) -> None:
        """Stop every worker and its descendants; drain their output."""
        stop_processes(self.workers, sig, grace_s, force)
        if self._guardian is not None:
            for worker in self.workers:
                self._guardian.release(worker.pid)
        self.drain(5.0)

    def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds in all for the output of the workers that have
        exited to be copied (a worker's traceback comes before what the launcher says of it);
        the copiers of running workers go on."""
        deadline = time.monotonic() + timeout
        for local_rank, copier in self._copiers:
            if self.workers[local_rank].poll() is not None:
                copier.join(max(0.0, deadline - time.monotonic()))

    def pids(self) -> set[int]:
        """The workers' pids."""
        return {worker.pid for worker in self.workers}


__all__ = ["Assignment", "LocalWorkerGroup", "WorkerFailure", "line_prefix", "worker_argv",
           "worker_env"]

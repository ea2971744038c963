"""``torch.distributed.launcher.api``: start a job's workers from a Python program.

``elastic_launch(config, entrypoint)(*args)`` runs ``entrypoint`` in
``config.nproc_per_node`` workers on this node (and as many on each other node that joins
the rendezvous), the way notebook launchers and job tools call torch's. It returns a dict
from global rank to the worker's return value (``None`` for each worker of a program
entrypoint), or raises ``ChildFailedError`` with torch's failure table (rank, exit code,
error file, the worker's traceback) when a worker fails.

The agent is ringtorch's launcher (``ringtorch.launcher``: rendezvous, supervision, restarts),
run in the calling process in its embedded mode: the caller's other children are left alone
and the caller does not become a subreaper. With ``start_method="fork"`` (what notebook
launchers pass) each worker is forked from the calling process and calls the function it
already holds, so a function typed into a notebook works, as under torch. Otherwise
(``"spawn"``, torch's default, or ``"forkserver"``) a callable reaches fresh interpreters as
spawn sends it (``ringtorch.launcher.call``): it must be importable, from a module or from
the calling script's ``__main__`` (which the workers import again, so keep the launch under
``if __name__ == "__main__":``).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ringtorch._workers import ChildFailedError, record
from ringtorch.distributed.elastic.multiprocessing import (
    DefaultLogsSpecs,
    LogsSpecs,
    SignalException,
    Std,
)
from ringtorch.launcher import call
from ringtorch.launcher.agent import Agent
from ringtorch.launcher.config import (
    DEFAULT_C10D_PORT,
    job_secret_choice,
    parse_endpoint,
    parse_signals,
)
from ringtorch.launcher.config import LaunchConfig as AgentConfig

DEFAULT_RDZV_TIMEOUT_S = 900

logger = logging.getLogger(__name__)


@dataclass
class LaunchConfig:
    """A launch, with torch's fields and defaults.

    ``rdzv_backend`` is ``static`` (``rdzv_endpoint`` HOST:PORT of node 0, the node's rank in
    ``rdzv_configs["rank"]``), ``c10d`` (nodes meet at ``rdzv_endpoint``), or a backend
    registered with ``rendezvous_handler_registry``. ``rdzv_configs["timeout"]`` is the join
    timeout in seconds (``rdzv_timeout`` is its legacy spelling; 900 by default).
    ``metrics_cfg``, ``event_log_handler``, ``numa_options`` and the duplicate filters are
    accepted for torch's signature and not used.
    """

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    logs_specs: LogsSpecs | None = None
    run_id: str = ""
    role: str = "default_role"
    rdzv_endpoint: str = ""
    rdzv_backend: str = "etcd"
    rdzv_configs: dict[str, Any] = field(default_factory=dict)
    rdzv_timeout: int = -1
    max_restarts: int = 3
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    log_line_prefix_template: str | None = None
    metrics_cfg: dict[str, str] = field(default_factory=dict)
    local_addr: str | None = None
    event_log_handler: str = "null"
    numa_options: Any = None
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
    duplicate_stdout_filters: list[str] | None = None
    duplicate_stderr_filters: list[str] | None = None
    virtual_local_rank: bool = False
    shutdown_timeout: int | None = None

    def __post_init__(self) -> None:
        if self.rdzv_timeout != -1:
            self.rdzv_configs["timeout"] = self.rdzv_timeout
        elif "timeout" not in self.rdzv_configs:
            self.rdzv_configs["timeout"] = DEFAULT_RDZV_TIMEOUT_S
        if self.logs_specs is None:
            self.logs_specs = DefaultLogsSpecs()
        if self.shutdown_timeout is None:
            self.shutdown_timeout = int(os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30"))
        elif self.shutdown_timeout < 0:
            raise ValueError(
                f"shutdown_timeout must be non-negative, got {self.shutdown_timeout}")


class elastic_launch:
    """``elastic_launch(config, entrypoint)(*args)``: run ``entrypoint`` in every worker.

    ``entrypoint`` is a Python callable (its return values come back, by global rank) or a
    program's path (run as ``entrypoint *args``; each rank's value is None).
    """

    def __init__(self, config: LaunchConfig, entrypoint: Callable[..., Any] | str | None,
                 health_check_server: Any = None) -> None:
        self._config = config
        self._entrypoint = entrypoint
        self._health_check_server = health_check_server

    def __call__(self, *args: Any) -> dict[int, Any]:
        return launch_agent(self._config, self._entrypoint, list(args),
                            health_check_server=self._health_check_server)


def _entrypoint_name(entrypoint: Callable[..., Any] | str | None, args: list[Any]) -> str:
    """What the failure table calls the job: the function's name, the program, or for
    ``sys.executable`` the script (its first argument that is not an option)."""
    if callable(entrypoint):
        return str(getattr(entrypoint, "__name__", repr(entrypoint)))
    if isinstance(entrypoint, str):
        if entrypoint == sys.executable:
            return next((str(a) for a in args if not str(a).startswith("-")), "")
        return entrypoint
    return ""


def _static_endpoint(config: LaunchConfig) -> tuple[str, int]:
    endpoint = config.rdzv_endpoint.strip()
    if not endpoint:
        raise ValueError(
            "Endpoint is missing in endpoint. Try to add --master-addr and --master-port")
    host, port = parse_endpoint(endpoint, default_port=-1)
    if port == -1:
        raise ValueError(f"port is missing in endpoint: {endpoint}. Try to specify --master-port")
    if "rank" not in config.rdzv_configs:
        raise ValueError("rank is absent in RendezvousParameters.Try add --node-rank to the cmd "
                         "request")
    return host, port


def _agent_config(config: LaunchConfig, argv: list[str],
                  fork_target: Callable[[], Any] | None = None) -> AgentConfig:
    """The launcher's own config for ``config``."""
    rdzv: dict[str, Any] = dict(config.rdzv_configs)  # a custom backend gets them as given
    static: dict[str, Any] = {}
    endpoint = config.rdzv_endpoint
    if config.rdzv_backend == "c10d":
        rdzv = {k: str(v) for k, v in rdzv.items()}
        rdzv.setdefault("join_timeout", rdzv.get("timeout", str(DEFAULT_RDZV_TIMEOUT_S)))
        if not endpoint.strip():
            endpoint = f"localhost:{DEFAULT_C10D_PORT}"  # torch's default for c10d
    if config.rdzv_backend == "static":
        host, port = _static_endpoint(config)
        static = {"master_addr": host, "master_port": port,
                  "node_rank": int(config.rdzv_configs["rank"])}
    specs = config.logs_specs
    secret = job_secret_choice(multi_node=config.max_nodes > 1)
    if secret.warning:
        logger.warning(secret.warning)
    assert config.shutdown_timeout is not None  # set by __post_init__
    return AgentConfig(
        argv=tuple(argv), nproc_per_node=config.nproc_per_node, min_nodes=config.min_nodes,
        max_nodes=config.max_nodes, run_id=config.run_id, role=config.role,
        rdzv_backend=config.rdzv_backend, rdzv_endpoint=endpoint,
        rdzv_configs=rdzv, local_addr=config.local_addr, max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        shutdown_timeout=float(config.shutdown_timeout),
        log_dir=getattr(specs, "root_log_dir", None),
        redirects=getattr(specs, "_redirects", Std.NONE), tee=getattr(specs, "_tee", Std.NONE),
        local_ranks_filter=_ranks(getattr(specs, "_local_ranks_filter", None)),
        log_line_prefix_template=config.log_line_prefix_template,
        signals_to_handle=parse_signals(config.signals_to_handle),
        virtual_local_rank=config.virtual_local_rank, secret=secret.secret,
        fork_target=fork_target, **static)


def _ranks(ranks: Any) -> frozenset[int] | None:
    return None if ranks is None else frozenset(int(r) for r in ranks)


def launch_agent(config: LaunchConfig, entrypoint: Callable[..., Any] | str | None,
                 args: list[Any], health_check_server: Any = None) -> dict[int, Any]:
    """Run the job on this node and return each local worker's result by global rank.

    Raises:
        ChildFailedError: a worker failed and no restart was left (torch's failure table).
        SignalException: the launching process received one of ``signals_to_handle``.
        RendezvousError: the nodes could not agree on a round (its subclasses as torch's).
        ValueError: the config cannot describe a job (the message says which field).
    """
    call.check_not_preparing()
    if health_check_server is not None:
        raise ValueError("health_check_server is not supported by ringtorch's launcher")
    if entrypoint is None or not (callable(entrypoint) or isinstance(entrypoint, str)):
        raise ValueError(f"entrypoint must be a callable or a program's path, got {entrypoint!r}")
    if not config.run_id:
        config.run_id = str(uuid.uuid4().int)
        logger.warning("config has no run_id, generated a random run_id: %s", config.run_id)
    name = _entrypoint_name(entrypoint, args)
    work_dir = tempfile.mkdtemp(prefix="ringtorch_launch_")  # mode 0700
    try:
        fork_target = None
        if callable(entrypoint) and config.start_method == "fork":
            argv = [name]  # each worker is forked from here and calls the function itself
            fork_target = functools.partial(record(call.call_and_store), entrypoint,
                                            tuple(args), work_dir)
        elif callable(entrypoint):
            payload = os.path.join(work_dir, "payload")
            call.write_payload(payload, entrypoint, tuple(args))
            argv = [sys.executable, "-u", "-m", call.__name__, payload, work_dir]
        else:
            argv = [entrypoint, *(str(a) for a in args)]
        agent = Agent(_agent_config(config, argv, fork_target), title=name, embedded=True)
        code = agent.run()
        if agent.failures:
            raise ChildFailedError(name=name, failures={
                f.global_rank: f.detail for f in agent.failures})
        if code > 128:
            sig = signal.Signals(code - 128)
            raise SignalException(f"Process {os.getpid()} got signal: {sig}", sigval=sig)
        if agent.left_gracefully:
            return {}  # the rendezvous left this node out: none of its workers ran
        if code != 0 or agent.last_assignment is None:
            raise RuntimeError(f"{name} did not finish: the job was stopped by another node "
                               f"(see the launcher's messages above)")
        first = agent.last_assignment.base_global_rank
        ranks = range(first, first + config.nproc_per_node)
        if callable(entrypoint):
            return {rank: call.read_result(work_dir, rank) for rank in ranks}
        return dict.fromkeys(ranks)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


__all__ = ["LaunchConfig", "elastic_launch", "launch_agent"]

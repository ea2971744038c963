"""What a launch is made of, and the pure parsers that turn flag strings into it.

:class:`LaunchConfig` is the agent's whole input: the CLI (``ringtorch.distributed.run``)
builds one from torchrun's flags and the agent never looks at argv or flags again. Each
parser here raises ``LaunchConfigError`` with a message that names the flag and the value.
"""

from __future__ import annotations

import enum
import os
import secrets
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ringtorch import _config
from ringtorch._wire import secret_file
from ringtorch._wire.handshake import job_secret
from ringtorch.launcher.handlers import rendezvous_handler_registry

DEFAULT_C10D_PORT = 29400
LOCAL_RANK_MACRO = "${local_rank}"
RDZV_BACKENDS = ("static", "c10d")


class LaunchConfigError(ValueError):
    """A flag or combination of flags that cannot describe a job; the message says which."""


class Std(enum.IntFlag):
    """Which standard streams a --redirects / --tee setting applies to (torch's values)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3


def parse_std(flag: str, text: str) -> Std | dict[int, Std]:
    """``"3"`` -> Std.ALL for every local rank; ``"0:1,1:2"`` -> {0: OUT, 1: ERR}."""

    def one(value: str) -> Std:
        try:
            number = int(value)
        except ValueError:
            number = -1
        if number not in (0, 1, 2, 3):
            raise LaunchConfigError(
                f"{flag} takes 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or a per-rank map "
                f"like 0:1,1:2; got {text!r}")
        return Std(number)

    text = text.strip()
    if ":" not in text:
        return one(text or "0")
    mapping: dict[int, Std] = {}
    for item in text.split(","):
        rank, _, value = item.partition(":")
        if not rank.strip().isdigit():
            raise LaunchConfigError(f"{flag}: {item!r} is not LOCAL_RANK:STREAMS in {text!r}")
        mapping[int(rank)] = one(value)
    return mapping


def std_for(spec: Std | dict[int, Std], local_rank: int) -> Std:
    """The streams a --redirects/--tee spec selects for ``local_rank``."""
    if isinstance(spec, dict):
        return spec.get(local_rank, Std.NONE)
    return spec


def parse_nnodes(text: str) -> tuple[int, int]:
    """``"2"`` -> (2, 2); ``"1:4"`` -> (1, 4)."""
    parts = text.split(":")
    try:
        if len(parts) == 1:
            low = high = int(parts[0])
        elif len(parts) == 2:
            low, high = int(parts[0]), int(parts[1])
        else:
            raise ValueError
    except ValueError:
        raise LaunchConfigError(
            f"--nnodes takes a number of nodes or a range MIN:MAX, got {text!r}") from None
    if not 0 < low <= high:
        raise LaunchConfigError(
            f"--nnodes {text}: the minimum number of nodes ({low}) must be greater than zero "
            f"and at most the maximum ({high})")
    return low, high


def visible_gpu_count(environ: dict[str, str] | None = None, proc_dir: str = "/proc",
                      dev_dir: str = "/dev") -> int:
    """NVIDIA GPUs this process may use, without importing torch: the driver's device list
    (``/proc/driver/nvidia/gpus``, else the ``/dev/nvidiaN`` nodes) narrowed by
    CUDA_VISIBLE_DEVICES."""
    environ = dict(os.environ) if environ is None else environ
    try:
        installed = len(os.listdir(os.path.join(proc_dir, "driver", "nvidia", "gpus")))
    except OSError:
        try:
            installed = sum(1 for name in os.listdir(dev_dir)
                            if name.startswith("nvidia") and name[6:].isdigit())
        except OSError:
            installed = 0
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return installed
    # CUDA stops at the first invalid entry; "-1" or "" hides every device.
    count = 0
    for name in (v for v in visible.split(",") if v.strip()):
        if name.strip().startswith("-"):
            break
        count += 1
    return min(count, installed)


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask), as torch's launcher counts them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def resolve_nproc_per_node(text: str, gpu_count: int | None = None) -> int:
    """``--nproc-per-node``: a positive int, or ``cpu``, ``gpu`` or ``auto`` (GPUs, else CPUs)."""
    text = text.strip()
    if text.lstrip("-").isdigit():
        value = int(text)
        if value < 1:
            raise LaunchConfigError(
                f"--nproc-per-node must be at least 1 (or one of auto, cpu, gpu), got {value}")
        return value
    gpus = visible_gpu_count() if gpu_count is None else gpu_count
    if text == "cpu":
        return cpu_count()
    if text == "gpu":
        if gpus == 0:
            raise LaunchConfigError("--nproc-per-node gpu: Cuda is not available (no NVIDIA GPU "
                                    "visible to this process)")
        return gpus
    if text == "auto":
        return gpus or cpu_count()
    raise LaunchConfigError(
        f"Unsupported nproc_per_node value: {text} (use a positive integer, auto, cpu or gpu)")


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """``"join_timeout=60,last_call_timeout=5"`` -> {"join_timeout": "60", ...}."""
    conf: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise LaunchConfigError(f"--rdzv-conf: {item!r} is not KEY=VALUE in {text!r}")
        conf[key.strip()] = value.strip()
    return conf


def parse_endpoint(text: str, default_port: int = DEFAULT_C10D_PORT) -> tuple[str, int]:
    """``"host:port"``, ``"host"`` or ``"[::1]:port"`` -> (host, port)."""
    text = text.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host:
        raise LaunchConfigError(f"--rdzv-endpoint {text!r} has no host")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise LaunchConfigError(f"--rdzv-endpoint {text!r}: port must be 0-65535")
    return host, int(port_text)


def parse_signals(text: str) -> tuple[int, ...]:
    """``"SIGTERM,SIGINT"`` -> (15, 2)."""
    found = []
    for name in filter(None, (part.strip() for part in text.split(","))):
        try:
            found.append(int(signal.Signals[name]))
        except KeyError:
            raise LaunchConfigError(f"--signals-to-handle: unknown signal {name!r}") from None
    return tuple(found)


@dataclass(frozen=True)
class SecretChoice:
    """The job secret a launcher uses and what to tell the user about it."""

    secret: str
    warning: str | None = None


def choose_job_secret(env_secret: str, multi_node: bool, allow_no_secret: bool,
                      secret_file: str | None = None) -> SecretChoice:
    """The job secret policy (docs/launching.md, "The job secret").

    A secret set in RINGTORCH_SECRET is used as is. A single-node job makes its own (32
    random bytes, hex), since nobody else needs to know it. The launchers of a multi-node job
    cannot agree on one over the network without an authenticated channel, which is what the
    secret is for: they and their workers use the per-user secret file (``secret_file``: its
    path when it holds a secret, None when it is turned off or could not be made), which nodes
    sharing a home directory share; the choice is then "" (no secret passed on: every process
    reads the file, and its errors name the file). Without the file they refuse, unless the
    user opts out explicitly with RINGTORCH_ALLOW_NO_SECRET=1 (unauthenticated, with a warning).

    Raises:
        LaunchConfigError: multi-node, no secret at all, no opt-out.
    """
    if env_secret:
        return SecretChoice(env_secret)
    if not multi_node:
        return SecretChoice(secrets.token_hex(32))
    if secret_file is not None:
        return SecretChoice("")
    if allow_no_secret:
        return SecretChoice("", warning=(
            "WARNING: RINGTORCH_ALLOW_NO_SECRET=1: this multi-node job runs WITHOUT a job secret; "
            "anyone who can reach its ports can join it, read its data and (through RPC or "
            "object collectives) run code in it. Set RINGTORCH_SECRET on every node instead."))
    raise LaunchConfigError(
        "a multi-node job needs a job secret shared by every node, and there is no per-user "
        "secret file (RINGTORCH_SECRET_FILE is empty, or the file could not be created): set "
        "RINGTORCH_SECRET to the same random value on each node, e.g. export "
        "RINGTORCH_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))'), and pass "
        "it to each launcher; or set RINGTORCH_ALLOW_NO_SECRET=1 to run unauthenticated (not "
        "recommended)")


def job_secret_choice(multi_node: bool) -> SecretChoice:
    """:func:`choose_job_secret` with this process's settings (RINGTORCH_SECRET,
    RINGTORCH_ALLOW_NO_SECRET) and its per-user secret file, made here if need be.

    Raises:
        LaunchConfigError: as choose_job_secret, or the secret file must not be used (its
            mode, owner or content; the message says what to do).
    """
    env_secret = _config.SECRET.get()
    try:
        usable = multi_node and not env_secret and job_secret() is not None
    except secret_file.SecretFileError as exc:
        raise LaunchConfigError(str(exc)) from None
    return choose_job_secret(env_secret, multi_node=multi_node,
                             allow_no_secret=_config.ALLOW_NO_SECRET.get(),
                             secret_file=secret_file.configured_path() if usable else None)


@dataclass(frozen=True)
class LaunchConfig:
    """Everything the agent needs to run one job on this node.

    ``argv`` is the worker command line; LOCAL_RANK_MACRO in it becomes the local rank.
    """

    argv: tuple[str, ...]
    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    node_rank: int = 0
    run_id: str = "none"
    role: str = "default"
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_configs: dict[str, str] = field(default_factory=dict)
    master_addr: str = "127.0.0.1"
    master_port: int | None = None
    local_addr: str | None = None
    max_restarts: int = 0
    monitor_interval: float = 0.1
    shutdown_timeout: float = 30.0
    log_dir: str | None = None
    trace_dir: str | None = None  # --trace: the merged timeline goes there (docs/timeline.md)
    redirects: Std | dict[int, Std] = Std.NONE
    tee: Std | dict[int, Std] = Std.NONE
    local_ranks_filter: frozenset[int] | None = None
    log_line_prefix_template: str | None = None
    signals_to_handle: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                          signal.SIGQUIT)
    virtual_local_rank: bool = False
    summary: bool = True  # print the end-of-job summary (--no-summary: off)
    keep_going: bool = False  # --on-worker-failure=continue: a failed worker stops no other
    secret: str = field(default="", repr=False)
    fork_target: Callable[[], Any] | None = field(default=None, repr=False, compare=False)
    """When set, each worker is forked from the agent's process to run it (``argv`` only names
    the job); ``elastic_launch`` with ``start_method="fork"``."""

    @property
    def is_single_node(self) -> bool:
        """One node only: no node rendezvous, everything on loopback."""
        return self.max_nodes == 1

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise LaunchConfigError(f"nproc_per_node must be at least 1, got {self.nproc_per_node}")
        if self.max_restarts < 0:
            raise LaunchConfigError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        if self.monitor_interval <= 0:
            raise LaunchConfigError(
                f"--monitor-interval must be > 0 seconds, got {self.monitor_interval}")
        custom = self.rdzv_backend not in RDZV_BACKENDS
        if custom and not rendezvous_handler_registry.is_registered(self.rdzv_backend):
            raise LaunchConfigError(
                f"--rdzv-backend {self.rdzv_backend!r} is not supported; use one of "
                f"{', '.join(RDZV_BACKENDS)}, or register a custom backend under that name "
                f"(rendezvous_handler_registry.register, or a torchrun.handlers entry point)")
        if self.rdzv_backend == "c10d" and not self.rdzv_endpoint:
            raise LaunchConfigError("--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT] "
                                    "(the address of the node that hosts the rendezvous)")
        if self.rdzv_backend == "static" and self.min_nodes != self.max_nodes:
            raise LaunchConfigError(
                f"--nnodes {self.min_nodes}:{self.max_nodes} needs a dynamic rendezvous: add "
                f"--rdzv-backend c10d --rdzv-endpoint HOST:PORT (static rendezvous needs a "
                f"fixed number of nodes)")
        if self.master_port == 0 and self.rdzv_backend == "static" and not self.is_single_node:
            raise LaunchConfigError("--master-port 0 (any free port) works on a single node "
                                    "only: the other nodes must know the port")
        if self.rdzv_backend == "static" and not 0 <= self.node_rank < self.max_nodes:
            raise LaunchConfigError(
                f"--node-rank {self.node_rank} is out of range for --nnodes {self.max_nodes} "
                f"(node ranks are 0..{self.max_nodes - 1})")


__all__ = [
    "DEFAULT_C10D_PORT",
    "LOCAL_RANK_MACRO",
    "RDZV_BACKENDS",
    "LaunchConfig",
    "LaunchConfigError",
    "SecretChoice",
    "Std",
    "choose_job_secret",
    "cpu_count",
    "parse_endpoint",
    "parse_nnodes",
    "parse_rdzv_conf",
    "parse_signals",
    "parse_std",
    "resolve_nproc_per_node",
    "std_for",
    "visible_gpu_count",
]

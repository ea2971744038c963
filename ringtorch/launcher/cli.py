"""ringrun's command line: torchrun's flags turned into a LaunchConfig, then the agent.

The same command has three names: ``ringrun``, ``python -m ringtorch.distributed.run`` (both
import ``ringtorch.distributed`` first, hence torch, as torchrun does) and
``python -m ringtorch.launcher``, which imports no torch and starts in a tenth of the time.
``ringtorch.distributed.run`` and ``ringtorch.distributed.launch`` re-export this module.

Every torchrun flag is accepted in both spellings (``--nproc-per-node``/``--nproc_per_node``)
and, as in torchrun, from a ``PET_<DEST>`` environment variable when absent from the command
line. Bad input never reaches a worker: an unknown flag, a missing script,
``--nproc-per-node 0``, a busy ``--master-port`` or an unreachable endpoint end the launcher
with a one-line ``ringrun: error: ...`` and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import uuid
import warnings
from argparse import REMAINDER, ArgumentParser
from collections.abc import Sequence
from typing import Any

from ringtorch.launcher.agent import launch
from ringtorch.launcher.config import (
    LOCAL_RANK_MACRO,
    LaunchConfig,
    LaunchConfigError,
    job_secret_choice,
    parse_nnodes,
    parse_rdzv_conf,
    parse_signals,
    parse_std,
    resolve_nproc_per_node,
)
from ringtorch.launcher.messages import say

EXIT_USAGE = 2
_RUN_PATH_BOOTSTRAP = ("import runpy, sys; sys.argv = sys.argv[1:]; "
                       "runpy.run_path(sys.argv[0], run_name='__main__')")


class env(argparse.Action):
    """A flag whose default comes from ``PET_<DEST>`` before the given default."""

    def __init__(self, dest: str, default: Any = None, required: bool = False,
                 **kwargs: Any) -> None:
        default = os.environ.get(f"PET_{dest.upper()}", default)
        super().__init__(dest=dest, default=default, required=required and not default,
                         **kwargs)

    def __call__(self, parser: ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)


class check_env(argparse.Action):
    """A boolean flag, also set by ``PET_<DEST>=1``."""

    def __init__(self, dest: str, default: bool = False, **kwargs: Any) -> None:
        value = os.environ.get(f"PET_{dest.upper()}", "1" if default else "0")
        super().__init__(dest=dest, const=True, default=bool(int(value)), nargs=0, **kwargs)

    def __call__(self, parser: ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, self.const)


def _both(name: str) -> list[str]:
    """``--nproc-per-node`` and ``--nproc_per_node``."""
    spellings = [name]
    if "-" in name[2:]:
        spellings.append("--" + name[2:].replace("-", "_"))
    return spellings


# (flags, type, default, help) of the value flags, in torchrun's order.
_VALUE_FLAGS: list[tuple[list[str], Any, Any, str]] = [
    (["--nnodes"], str, "1:1", "Number of nodes, or MIN:MAX for an elastic job."),
    (_both("--nproc-per-node"), str, "1", "Workers per node: an int, or auto, cpu, gpu."),
    (_both("--rdzv-backend"), str, "static", "Rendezvous backend: static, c10d, or a custom one "
                                            "(a torchrun.handlers entry point)."),
    (_both("--rdzv-endpoint"), str, "", "Rendezvous endpoint HOST[:PORT] (c10d)."),
    (_both("--rdzv-id"), str, "none", "Job id shared by the nodes of one job."),
    (_both("--rdzv-conf"), str, "", "Rendezvous options KEY=VALUE,... (join_timeout, "
                                    "last_call_timeout, close_timeout, heartbeat_timeout, "
                                    "is_host)."),
    (_both("--max-restarts"), int, 0, "Worker group restarts before giving up."),
    (_both("--monitor-interval"), float, 0.1, "Seconds between looks at the workers."),
    (_both("--start-method"), str, "spawn", "Accepted for torchrun compatibility; workers are "
                                            "always programs started with fork+exec."),
    (_both("--event-log-handler"), str, "null", "Only 'null' is supported."),
    (["--role"], str, "default", "User-defined role of the workers."),
    (_both("--log-dir"), str, None, "Directory for logs and error files "
                                    "({log_dir}/{rdzv_id}_*/attempt_N/LOCAL_RANK/)."),
    (["-r", "--redirects"], str, "0", "Send streams to log files only: 0 none, 1 stdout, "
                                      "2 stderr, 3 both, or per rank 0:1,1:2."),
    (["-t", "--tee"], str, "0", "Copy streams to log files and to the console with a "
                                "[rankN]: prefix (values as --redirects)."),
    (_both("--local-ranks-filter"), str, "", "Show only these local ranks on the console."),
    (_both("--node-rank"), int, 0, "Rank of this node (static rendezvous)."),
    (_both("--master-addr"), str, "127.0.0.1", "Address of node 0 (static rendezvous)."),
    (_both("--master-port"), int, None, "Port on node 0 for the workers' store; default: a "
                                        "free port on one node, 29500 on several."),
    (_both("--local-addr"), str, None, "Address other nodes use to reach this one."),
    (_both("--logs-specs"), str, None, "Not supported (torchrun plug-in)."),
    (_both("--numa-binding"), str, None, "Not supported."),
    (_both("--signals-to-handle"), str, "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
     "Signals that stop the workers (and the launcher)."),
    (_both("--shutdown-timeout"), float, None, "Seconds between SIGTERM and SIGKILL at "
                                               "teardown (default TORCH_ELASTIC_SHUTDOWN_TIMEOUT "
                                               "or 30)."),
    (_both("--duplicate-stdout-filters"), str, "", "Not supported."),
    (_both("--duplicate-stderr-filters"), str, "", "Not supported."),
    (["--trace"], str, None, "Write the job's timeline (Chrome trace of every rank's "
                             "collectives, RPCs and DDP buckets) to DIR/trace.json."),
]

_BOOL_FLAGS: list[tuple[list[str], str]] = [
    (["--standalone"], "A single-node job on a free port; rendezvous flags are ignored."),
    (["-m", "--module"], "Run the script as a module, like python -m."),
    (_both("--no-python"), "Execute the script directly, without python."),
    (_both("--run-path"), "Run the script with runpy.run_path in a fresh interpreter."),
    (_both("--virtual-local-rank"), "LOCAL_RANK=0 and one CUDA device per worker."),
]


def get_args_parser(prog: str = "ringrun") -> ArgumentParser:
    """The ringrun argument parser (torchrun's flags)."""
    parser = ArgumentParser(prog=prog, description="ringtorch's distributed launcher "
                                                   "(torchrun-compatible)")
    for flags, kind, default, text in _VALUE_FLAGS:
        parser.add_argument(*flags, action=env, type=kind, default=default, help=text)
    for flags, text in _BOOL_FLAGS:
        parser.add_argument(*flags, action=check_env, help=text)
    parser.add_argument("--summary", action=argparse.BooleanOptionalAction, default=True,
                        help="At the end, print each rank's time in collectives and bytes, "
                             "and the slowest rank of each collective (default: on).")
    parser.add_argument("--on-worker-failure", choices=("stop", "continue"), default="stop",
                        help="stop: a failed worker stops the others (torchrun's behaviour); "
                             "continue: the others go on (they may shrink the job and keep "
                             "training: docs/recovery.md), and the job succeeds if they all "
                             "exit 0.")
    parser.add_argument("training_script", type=str,
                        help="The program to run on every worker, then its arguments.")
    parser.add_argument("training_script_args", nargs=REMAINDER)
    return parser


def parse_args(args: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ringrun's command line (exits with code 2 and a usage line on bad flags)."""
    return get_args_parser().parse_args(args)


def _unsupported(args: argparse.Namespace) -> None:
    for name, flag in (("logs_specs", "--logs-specs"), ("numa_binding", "--numa-binding"),
                       ("duplicate_stdout_filters", "--duplicate-stdout-filters"),
                       ("duplicate_stderr_filters", "--duplicate-stderr-filters")):
        if getattr(args, name, None):
            raise LaunchConfigError(f"{flag} is not supported by ringrun")
    if getattr(args, "event_log_handler", "null") != "null":
        raise LaunchConfigError("--event-log-handler: only 'null' is supported by ringrun")


def worker_command(args: argparse.Namespace, use_env: bool = True,
                   local_rank_arg: str = "--local-rank") -> list[str]:
    """The worker's argv: python -u [-m] script [--local-rank=N] args (LOCAL_RANK_MACRO for N).

    Raises:
        LaunchConfigError: the script or program does not exist, or flags conflict.
    """
    script = args.training_script
    if args.run_path:
        if not os.path.isfile(script):
            raise LaunchConfigError(f"training script {script!r} does not exist")
        cmd = [os.getenv("PYTHON_EXEC", sys.executable), "-u", "-c", _RUN_PATH_BOOTSTRAP,
               os.path.abspath(script)]
    elif args.no_python:
        if args.module:
            raise LaunchConfigError("Don't use both the '--no-python' flag and the '--module' "
                                    "flag at the same time.")
        if shutil.which(script) is None:
            raise LaunchConfigError(f"program {script!r} does not exist or is not executable")
        cmd = [script]
    else:
        cmd = [os.getenv("PYTHON_EXEC", sys.executable), "-u"]
        if args.module:
            cmd += ["-m", script]
        elif not os.path.isfile(script):
            raise LaunchConfigError(f"training script {script!r} does not exist")
        else:
            cmd.append(script)
    if not use_env:
        cmd.append(f"{local_rank_arg}={LOCAL_RANK_MACRO}")
    return cmd + list(args.training_script_args)


def _shutdown_timeout(args: argparse.Namespace) -> float:
    if args.shutdown_timeout is not None:
        return float(args.shutdown_timeout)
    text = os.environ.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "30")
    try:
        return float(text)
    except ValueError:
        raise LaunchConfigError(
            f"TORCH_ELASTIC_SHUTDOWN_TIMEOUT={text!r} is not a number of seconds") from None


def _ranks_filter(text: str) -> frozenset[int] | None:
    if not text:
        return None
    try:
        return frozenset(int(item) for item in text.split(","))
    except ValueError:
        raise LaunchConfigError("--local-ranks-filter must be a comma-separated list of "
                                "integers e.g. --local-ranks-filter=0,1,2") from None


def config_from_args(args: argparse.Namespace, use_env: bool = True,
                     local_rank_arg: str = "--local-rank") -> LaunchConfig:
    """Turn parsed flags into the agent's LaunchConfig (no side effects).

    Raises:
        LaunchConfigError: a flag value or combination that cannot describe a job.
    """
    _unsupported(args)
    min_nodes, max_nodes = parse_nnodes(args.nnodes)
    backend, endpoint, run_id = args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id
    if args.standalone:
        if max_nodes > 1:
            raise LaunchConfigError("--standalone runs a single-node job; it cannot be used "
                                    f"with --nnodes {args.nnodes}")
        backend, endpoint, run_id = "static", "", str(uuid.uuid4())
    if args.max_restarts < 0:
        raise LaunchConfigError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    nproc = resolve_nproc_per_node(args.nproc_per_node)
    secret = job_secret_choice(multi_node=max_nodes > 1)
    if secret.warning:
        say(secret.warning)
    return LaunchConfig(
        argv=tuple(worker_command(args, use_env, local_rank_arg)),
        nproc_per_node=nproc, min_nodes=min_nodes, max_nodes=max_nodes,
        node_rank=args.node_rank, run_id=run_id, role=args.role,
        rdzv_backend=backend, rdzv_endpoint=endpoint, rdzv_configs=parse_rdzv_conf(args.rdzv_conf),
        master_addr=args.master_addr, master_port=args.master_port, local_addr=args.local_addr,
        max_restarts=args.max_restarts, monitor_interval=args.monitor_interval,
        shutdown_timeout=_shutdown_timeout(args), log_dir=args.log_dir, trace_dir=args.trace,
        redirects=parse_std("--redirects", args.redirects), tee=parse_std("--tee", args.tee),
        local_ranks_filter=_ranks_filter(args.local_ranks_filter),
        log_line_prefix_template=os.getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
        signals_to_handle=parse_signals(args.signals_to_handle),
        virtual_local_rank=args.virtual_local_rank, summary=getattr(args, "summary", True),
        keep_going=getattr(args, "on_worker_failure", "stop") == "continue",
        secret=secret.secret,
    )


def _omp_banner(config: LaunchConfig) -> None:
    if "OMP_NUM_THREADS" not in os.environ and config.nproc_per_node > 1:
        say("\n*****************************************\n"
            "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, "
            "to avoid your system being overloaded, please further tune the variable for "
            "optimal performance in your application as needed. \n"
            "*****************************************")


def run(args: argparse.Namespace, use_env: bool = True,
        local_rank_arg: str = "--local-rank") -> int:
    """Launch the job the parsed flags describe; the exit code (0 when every worker succeeded)."""
    try:
        config = config_from_args(args, use_env, local_rank_arg)
    except LaunchConfigError as exc:
        say(f"error: {exc}")
        return EXIT_USAGE
    _omp_banner(config)
    return launch(config, title=os.path.basename(args.training_script))


def main(args: Sequence[str] | None = None) -> int:
    """The ``ringrun`` console script; returns the exit code."""
    return run(parse_args(args))


LEGACY_LOCAL_RANK_ARG = "--local_rank"

_DEPRECATION = (
    "The module ringtorch.distributed.launch is deprecated\n"
    "and will be removed in future. Use ringrun (python -m ringtorch.distributed.run).\n"
    "Note that --use-env is set by default in ringrun.\n"
    "If your script expects `--local_rank` argument to be set, please\n"
    "change it to read from `os.environ['LOCAL_RANK']` instead.\n"
)


def parse_legacy_args(args: Sequence[str] | None = None) -> argparse.Namespace:
    """``torch.distributed.launch``'s flags: ringrun's plus --use-env."""
    parser = get_args_parser(prog="python -m ringtorch.distributed.launch")
    parser.add_argument("--use-env", "--use_env", default=False, action="store_true",
                        help="Pass the local rank in LOCAL_RANK only, not as --local_rank.")
    return parser.parse_args(args)


def legacy_launch(args: argparse.Namespace) -> int:
    """Launch the job the legacy flags describe; the exit code."""
    if args.no_python and not args.use_env:
        say("error: When using the '--no-python' flag, you must also set the '--use-env' flag.")
        return EXIT_USAGE
    return run(args, use_env=args.use_env, local_rank_arg=LEGACY_LOCAL_RANK_ARG)


def legacy_main(args: Sequence[str] | None = None) -> int:
    """``python -m ringtorch.distributed.launch``; deprecated as in torch (a FutureWarning)."""
    warnings.warn(_DEPRECATION, FutureWarning, stacklevel=2)
    return legacy_launch(parse_legacy_args(args))

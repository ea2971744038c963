"""ringrun's command line and the launcher's pure parsers: torchrun's flags, values, errors.

Everything here runs in-process without starting a worker; the CLIs themselves are run in
subprocesses by tests/integration/test_run_*.py and test_launch*.py.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from ringtorch.launcher import (
    Assignment,
    LaunchConfig,
    LaunchConfigError,
    Std,
    parse_endpoint,
    parse_nnodes,
    parse_rdzv_conf,
    parse_std,
    resolve_nproc_per_node,
    worker_env,
)
from ringtorch.launcher import cli as run
from ringtorch.launcher.config import SecretChoice, choose_job_secret, visible_gpu_count


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


@pytest.mark.parametrize("spelling", ["--nproc-per-node", "--nproc_per_node"])
def test_dash_and_underscore_spellings_are_the_same_flag(spelling: str, script: str) -> None:
    args = run.parse_args([spelling, "3", "--max_restarts", "2", "--master-port", "1234", script])
    assert (args.nproc_per_node, args.max_restarts, args.master_port) == ("3", 2, 1234)


def test_defaults_are_torchruns(script: str) -> None:
    args = run.parse_args([script])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.rdzv_id) == (
        "1:1", "1", "static", "none")
    assert (args.max_restarts, args.monitor_interval, args.master_addr) == (0, 0.1, "127.0.0.1")
    assert args.master_port is None and args.node_rank == 0 and args.log_dir is None


def test_script_arguments_are_passed_untouched(script: str) -> None:
    args = run.parse_args(["--nnodes", "1", script, "--lr", "0.1", "--nnodes", "x"])
    assert args.training_script == script
    assert args.training_script_args == ["--lr", "0.1", "--nnodes", "x"]


def test_pet_environment_variables_give_defaults(monkeypatch: pytest.MonkeyPatch,
                                                 script: str) -> None:
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")
    monkeypatch.setenv("PET_MAX_RESTARTS", "3")
    monkeypatch.setenv("PET_STANDALONE", "1")
    args = run.parse_args([script])
    assert (args.nproc_per_node, args.max_restarts, args.standalone) == ("4", 3, True)
    assert run.parse_args(["--nproc-per-node", "2", script]).nproc_per_node == "2"


def test_unknown_flag_is_a_usage_error(capsys: pytest.CaptureFixture[str], script: str) -> None:
    with pytest.raises(SystemExit) as exc:
        run.parse_args(["--nproc-per-nod3", "2", script])
    assert exc.value.code == 2
    assert "unrecognized arguments: --nproc-per-nod3" in capsys.readouterr().err


def test_worker_command_runs_the_script_unbuffered(script: str) -> None:
    config = run.config_from_args(run.parse_args([script, "a"]))
    assert config.argv == (sys.executable, "-u", script, "a")


def test_module_flag_runs_python_dash_m() -> None:
    config = run.config_from_args(run.parse_args(["-m", "pkg.train", "a"]))
    assert config.argv == (sys.executable, "-u", "-m", "pkg.train", "a")


def test_legacy_launch_passes_local_rank_argument_before_script_args(script: str) -> None:
    args = run.parse_legacy_args(["--nproc_per_node", "2", script, "a"])
    config = run.config_from_args(args, use_env=args.use_env,
                                  local_rank_arg=run.LEGACY_LOCAL_RANK_ARG)
    assert config.argv == (sys.executable, "-u", script, "--local_rank=${local_rank}", "a")
    args = run.parse_legacy_args(["--use_env", script])
    assert run.config_from_args(args, use_env=args.use_env).argv == (sys.executable, "-u", script)


def test_no_python_and_module_together_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(LaunchConfigError, match="^Don't use both the '--no-python' flag and the "
                                                "'--module' flag at the same time.$"):
        run.config_from_args(run.parse_args(["--no-python", "-m", "/bin/true"]))


@pytest.mark.parametrize(("argv", "message"), [
    (["missing_script.py"], r"^training script 'missing_script.py' does not exist$"),
    (["--nproc-per-node", "0", "X"], r"^--nproc-per-node must be at least 1 \(or one of auto, "
                                     r"cpu, gpu\), got 0$"),
    (["--nproc-per-node", "many", "X"], r"^Unsupported nproc_per_node value: many"),
    (["--nnodes", "2:1", "X"], r"^--nnodes 2:1: the minimum number of nodes \(2\) must be"),
    (["--nnodes", "1:2", "X"], r"^--nnodes 1:2 needs a dynamic rendezvous"),
    (["--nnodes", "2", "--node-rank", "2", "X"], r"^--node-rank 2 is out of range for "
                                                 r"--nnodes 2"),
    (["--rdzv-backend", "etcd", "X"], r"^--rdzv-backend 'etcd' is not supported"),
    (["--rdzv-backend", "c10d", "X"], r"^--rdzv-backend c10d needs --rdzv-endpoint"),
    (["--standalone", "--nnodes", "2", "X"], r"^--standalone runs a single-node job"),
    (["--max-restarts", "-1", "X"], r"^--max-restarts must be >= 0, got -1$"),
    (["--tee", "4", "X"], r"^--tee takes 0 \(none\), 1 \(stdout\), 2 \(stderr\) or 3"),
    (["--numa-binding", "node", "X"], r"^--numa-binding is not supported by ringrun$"),
    (["--local-ranks-filter", "a", "X"], r"^--local-ranks-filter must be a comma-separated"),
    (["--no-python", "no-such-program-xyz"], r"^program 'no-such-program-xyz' does not exist"),
])
def test_bad_flags_are_rejected_with_a_message(argv: list[str], message: str, script: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGTORCH_SECRET", "s" * 64)  # multi-node cases need one to get further
    argv = [script if a == "X" else a for a in argv]
    with pytest.raises(LaunchConfigError, match=message):
        run.config_from_args(run.parse_args(argv))


def test_legacy_no_python_without_use_env_is_rejected(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.warns(FutureWarning, match="ringtorch.distributed.launch is deprecated"):
        assert run.legacy_main(["--no_python", "/bin/true"]) == 2
    assert capsys.readouterr().err == (
        "ringrun: error: When using the '--no-python' flag, you must also set the "
        "'--use-env' flag.\n")


def test_run_reports_a_bad_flag_on_one_line_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run.main(["missing_script.py"]) == 2
    assert capsys.readouterr().err == "ringrun: error: training script 'missing_script.py' " \
                                      "does not exist\n"


@pytest.mark.parametrize(("text", "expected"), [
    ("0", Std.NONE), ("3", Std.ALL), ("1", Std.OUT), ("2", Std.ERR),
    ("0:1,1:2", {0: Std.OUT, 1: Std.ERR}),
])
def test_std_specs_parse_like_torchs(text: str, expected: object) -> None:
    assert parse_std("--tee", text) == expected


@pytest.mark.parametrize(("text", "expected"), [("2", (2, 2)), ("1:4", (1, 4)), ("3:3", (3, 3))])
def test_nnodes_is_a_count_or_a_range(text: str, expected: tuple[int, int]) -> None:
    assert parse_nnodes(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("node0:1234", ("node0", 1234)), ("node0", ("node0", 29400)),
    ("[::1]:5000", ("::1", 5000)), ("10.0.0.1:0", ("10.0.0.1", 0)),
])
def test_rendezvous_endpoint_parses_host_and_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(text) == expected


def test_rdzv_conf_is_key_value_pairs() -> None:
    assert parse_rdzv_conf("join_timeout=5, last_call_timeout=1") == {
        "join_timeout": "5", "last_call_timeout": "1"}
    with pytest.raises(LaunchConfigError, match=r"^--rdzv-conf: 'oops' is not KEY=VALUE"):
        parse_rdzv_conf("a=1,oops")


def test_nproc_per_node_auto_cpu_gpu() -> None:
    cpus = len(os.sched_getaffinity(0))
    assert resolve_nproc_per_node("cpu", gpu_count=0) == cpus
    assert resolve_nproc_per_node("auto", gpu_count=0) == cpus
    assert resolve_nproc_per_node("auto", gpu_count=3) == 3
    assert resolve_nproc_per_node("gpu", gpu_count=2) == 2
    with pytest.raises(LaunchConfigError, match="^--nproc-per-node gpu: Cuda is not available"):
        resolve_nproc_per_node("gpu", gpu_count=0)


def test_gpu_count_reads_the_driver_and_cuda_visible_devices(tmp_path: Path) -> None:
    gpus = tmp_path / "driver" / "nvidia" / "gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (gpus / bus).mkdir(parents=True)
    assert visible_gpu_count({}, proc_dir=str(tmp_path)) == 3
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "0,2"}, proc_dir=str(tmp_path)) == 2
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "1,-1,0"}, proc_dir=str(tmp_path)) == 1
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": ""}, proc_dir=str(tmp_path)) == 0
    empty = tmp_path / "empty"
    empty.mkdir()
    assert visible_gpu_count({}, proc_dir=str(empty), dev_dir=str(empty)) == 0
    devices = tmp_path / "dev"
    devices.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null"):
        (devices / name).touch()
    assert visible_gpu_count({}, proc_dir=str(empty), dev_dir=str(devices)) == 2


def test_single_node_job_makes_its_own_secret() -> None:
    first = choose_job_secret("", multi_node=False, allow_no_secret=False)
    second = choose_job_secret("", multi_node=False, allow_no_secret=False)
    assert len(first.secret) == 64 and int(first.secret, 16) >= 0
    assert first.secret != second.secret and first.warning is None


def test_a_secret_from_the_environment_is_used_as_is() -> None:
    assert choose_job_secret("abc", multi_node=True, allow_no_secret=False).secret == "abc"
    assert choose_job_secret("abc", multi_node=False, allow_no_secret=False).secret == "abc"


def test_a_multi_node_job_uses_the_per_user_secret_file() -> None:
    choice = choose_job_secret("", multi_node=True, allow_no_secret=False,
                               secret_file="/home/me/.config/ringtorch/secret")
    assert choice == SecretChoice("")  # no secret passed on: every process reads the file


def test_a_multi_node_job_without_any_secret_is_refused_unless_allowed() -> None:
    with pytest.raises(LaunchConfigError, match=(
            r"^a multi-node job needs a job secret shared by every node, and there is no "
            r"per-user secret file \(RINGTORCH_SECRET_FILE is empty, or the file could not be "
            r"created\): set RINGTORCH_SECRET to the same random value on each node")):
        choose_job_secret("", multi_node=True, allow_no_secret=False, secret_file=None)
    choice = choose_job_secret("", multi_node=True, allow_no_secret=True)
    assert choice.secret == "" and choice.warning is not None
    assert choice.warning.startswith("WARNING: RINGTORCH_ALLOW_NO_SECRET=1")


def test_worker_env_is_torchruns_contract() -> None:
    config = LaunchConfig(argv=("x",), nproc_per_node=2, max_nodes=3, min_nodes=3,
                          run_id="job7", max_restarts=4, secret="f00d")
    assignment = Assignment(round=2, group_rank=1, group_world_size=3, base_global_rank=2,
                            world_size=6, master_addr="10.1.2.3", master_port=4567)
    env = worker_env({"PATH": "/bin"}, config, assignment, local_rank=1, restart_count=1,
                     error_file="/tmp/e.json")
    assert env == {
        "PATH": "/bin", "RANK": "3", "GROUP_RANK": "1", "ROLE_RANK": "3", "ROLE_NAME": "default",
        "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "6", "GROUP_WORLD_SIZE": "3",
        "ROLE_WORLD_SIZE": "6", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "4567",
        "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "4",
        "TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": "/tmp/e.json", "RINGTORCH_SECRET": "f00d",
        "OMP_NUM_THREADS": "1",
    }


def test_worker_env_keeps_a_users_omp_num_threads() -> None:
    config = LaunchConfig(argv=("x",), nproc_per_node=2)
    assignment = Assignment(1, 0, 1, 0, 2, "127.0.0.1", 1)
    env = worker_env({"OMP_NUM_THREADS": "8"}, config, assignment, 0, 0, "/tmp/e")
    assert env["OMP_NUM_THREADS"] == "8"


def test_torch_named_modules_are_this_cli() -> None:
    from ringtorch.distributed import launch
    from ringtorch.distributed import run as dist_run

    assert dist_run.main is run.main and dist_run.get_args_parser is run.get_args_parser
    assert dist_run.config_from_args is run.config_from_args
    assert launch.main is run.legacy_main and launch.parse_args is run.parse_legacy_args

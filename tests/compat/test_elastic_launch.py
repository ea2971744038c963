"""``elastic_launch`` from a Python program: the same launches under torch's launcher and
ringtorch's give the same results and fail with the same ``ChildFailedError``.

Each test launches real workers (two per launch) with torch's
``torch.distributed.launcher.api`` and with ``ringtorch.distributed.launcher.api``, from this
process, as a notebook launcher does, and compares what comes back.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.launcher.api as torch_api
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError as TorchChildFailed

import ringtorch.distributed.launcher.api as ring_api
from ringtorch.distributed.elastic.multiprocessing.errors import ChildFailedError
from ringtorch.testing import free_port, wait_for
from tests.compat import _elastic_programs as P

# long (torch's elastic launch tests, a launcher run each: 100 s): in the slow stage
pytestmark = pytest.mark.slow

APIS = {"torch": torch_api, "ringtorch": ring_api}
DIST = {"torch": "torch.distributed", "ringtorch": "ringtorch.distributed"}


def _config(api: Any, **overrides: Any) -> Any:
    fields = {"min_nodes": 1, "max_nodes": 1, "nproc_per_node": 2, "run_id": "compat",
              "rdzv_backend": "c10d", "rdzv_endpoint": "localhost:0", "max_restarts": 0,
              "monitor_interval": 0.05}
    fields.update(overrides)
    return api.LaunchConfig(**fields)


def _both(fn: Any, *args: Any, **overrides: Any) -> dict[str, Any]:
    return {name: api.elastic_launch(_config(api, **overrides), fn)(*args)
            for name, api in APIS.items()}


def test_launch_config_has_torchs_fields_and_defaults() -> None:
    theirs = torch_api.LaunchConfig(min_nodes=1, max_nodes=2, nproc_per_node=3)
    ours = ring_api.LaunchConfig(min_nodes=1, max_nodes=2, nproc_per_node=3)
    names = list(torch_api.LaunchConfig.__dataclass_fields__)
    assert list(ring_api.LaunchConfig.__dataclass_fields__) == names
    for name in names:
        if name in ("logs_specs", "numa_options"):
            continue  # objects of each library's own classes
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.rdzv_configs == {"timeout": 900}
    assert ring_api.LaunchConfig(1, 1, 1, rdzv_timeout=60).rdzv_configs == {"timeout": 60}


def test_negative_shutdown_timeout_is_rejected_as_torch() -> None:
    for api in APIS.values():
        with pytest.raises(ValueError, match=r"^shutdown_timeout must be non-negative, got -1$"):
            api.LaunchConfig(1, 1, 1, shutdown_timeout=-1)


def test_training_function_returns_each_ranks_result_as_under_torch() -> None:
    results = {name: api.elastic_launch(_config(api), P.train)(DIST[name], 60)
               for name, api in APIS.items()}
    assert results["ringtorch"] == results["torch"]
    assert sorted(results["ringtorch"]) == [0, 1]
    for rank, value in results["ringtorch"].items():
        assert (value["rank"], value["world"], value["local_rank"]) == (rank, 2, rank)
    # the data-parallel training converged to the weights the data were made with
    assert results["ringtorch"][0]["weights"] == pytest.approx([1.0, -2.0, 0.5], abs=0.05)


def test_static_rendezvous_on_an_explicit_port_as_under_torch() -> None:
    results = {name: api.elastic_launch(_config(
        api, rdzv_backend="static", rdzv_endpoint=f"127.0.0.1:{free_port()}",
        rdzv_configs={"rank": 0}), P.train)(DIST[name], 2) for name, api in APIS.items()}
    assert results["ringtorch"] == results["torch"]


def test_program_entrypoint_returns_none_per_rank_as_torch() -> None:
    code = "import os, sys; sys.exit(0 if os.environ['WORLD_SIZE'] == '2' else 3)"
    assert _both(sys.executable, "-c", code) == {"torch": {0: None, 1: None},
                                                "ringtorch": {0: None, 1: None}}


def test_a_restart_reruns_every_worker_as_torch() -> None:
    results = _both(P.fail_first_attempt, max_restarts=1)
    assert results["ringtorch"] == results["torch"] == {0: (0, 1), 1: (1, 1)}


def _table(message: str) -> list[str]:
    """The failure table with what differs between runs masked (times, pids, paths, hosts)."""
    head, _, traceback = message.partition("  traceback : ")
    lines = head.splitlines()
    masks = [(r"^(  time      : )\S+$", r"\1<time>"), (r"\(pid: \d+\)", "(pid: <pid>)"),
             (r"^(  error_file: ).*$", r"\1<path>"), (r"^(  host      : ).*$", r"\1<host>")]
    for pattern, repl in masks:
        lines = [re.sub(pattern, repl, line) for line in lines]
    last = [line.strip() for line in traceback.strip().splitlines() if line.strip()]
    return lines + [last[-2] if last[-1].startswith("=") else last[-1]]


def test_failing_worker_raises_child_failed_error_with_torchs_table() -> None:
    errors = {}
    for name, api in APIS.items():
        with pytest.raises((ChildFailedError, TorchChildFailed)) as info:
            api.elastic_launch(_config(api), P.fail_on_rank)(1)
        errors[name] = info.value
    ours, theirs = errors["ringtorch"], errors["torch"]
    assert isinstance(ours, ChildFailedError)
    assert _table(str(ours)) == _table(str(theirs))
    assert _table(str(ours))[:6] == ["", "=" * 60, "fail_on_rank FAILED", "-" * 60, "Failures:",
                                     "  <NO_OTHER_FAILURES>"]
    assert "  rank      : 1 (local_rank: 1)" in str(ours)
    assert 'raise ValueError(f"bad batch on rank {rank}")' in str(ours)
    assert _table(str(ours))[-1] == "ValueError: bad batch on rank 1"
    rank, failure = ours.get_first_failure()
    assert (rank, failure.local_rank, failure.exitcode) == (1, 1, 1)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"rdzv_backend": "static", "rdzv_endpoint": ""},
     r"^Endpoint is missing in endpoint. Try to add --master-addr and --master-port$"),
    ({"rdzv_backend": "static", "rdzv_endpoint": "127.0.0.1"},
     r"^port is missing in endpoint: 127.0.0.1. Try to specify --master-port$"),
])
def test_bad_static_endpoint_is_rejected_with_torchs_message(overrides: dict[str, Any],
                                                              message: str) -> None:
    for api in APIS.values():
        with pytest.raises(ValueError, match=message):
            api.elastic_launch(_config(api, **overrides), P.fail_on_rank)(0)


def test_static_rendezvous_without_a_node_rank_is_rejected_as_torch() -> None:
    config = _config(ring_api, rdzv_backend="static", rdzv_endpoint="127.0.0.1:29512")
    with pytest.raises(ValueError, match=r"^rank is absent in RendezvousParameters.Try add "
                                         r"--node-rank to the cmd request$"):
        ring_api.elastic_launch(config, P.fail_on_rank)(0)


def test_a_backend_nobody_registered_is_refused_before_any_worker_starts() -> None:
    with pytest.raises(ValueError, match=r"^--rdzv-backend 'etcd' is not supported; use one of "
                                         r"static, c10d, or register a custom backend"):
        ring_api.elastic_launch(_config(ring_api, rdzv_backend="etcd"), P.fail_on_rank)(0)


def test_elastic_launch_tutorial_program_runs_its_main_defined_function(tmp_path: Path) -> None:
    program = tmp_path / "launch_tutorial.py"
    program.write_text(textwrap.dedent("""
        import ringtorch.distributed as dist
        from ringtorch.distributed.launcher.api import LaunchConfig, elastic_launch
        import torch

        def compute(scale):
            dist.init_process_group("gloo")
            t = torch.tensor([float(dist.get_rank() + 1)]) * scale
            dist.all_reduce(t)
            dist.destroy_process_group()
            return t.item()

        if __name__ == "__main__":
            config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="tutorial",
                                  rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                                  max_restarts=0)
            print(sorted(elastic_launch(config, compute)(10.0).items()))
    """))
    out = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[(0, 30.0), (1, 30.0)]"


def _failure_pair(tmp_path: Path, rank: int, exitcode: int, with_file: bool) -> tuple[Any, Any]:
    """The same failed worker as torch's ProcessFailure and as ringtorch's."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure as TorchFailure

    from ringtorch.distributed.elastic.multiprocessing.errors import ProcessFailure

    path = tmp_path / f"error{rank}.json"
    if with_file:
        path.write_text(json.dumps({"message": {
            "message": "ValueError: boom",
            "extraInfo": {"py_callstack": 'Traceback (most recent call last):\n  File "x.py", '
                                          'line 1\nValueError: boom\n',
                          "timestamp": str(1700000000 + rank)}}}))
    return (TorchFailure(rank, 4000 + rank, exitcode, str(path)),
            ProcessFailure(rank, 4000 + rank, exitcode, str(path)))


def test_failure_table_with_several_failures_is_torchs(tmp_path: Path) -> None:
    pairs = {0: _failure_pair(tmp_path, 0, 1, True), 2: _failure_pair(tmp_path, 2, 1, True),
             3: _failure_pair(tmp_path, 3, -9, False)}
    theirs = TorchChildFailed("train.py", {rank: pair[0] for rank, pair in pairs.items()})
    ours = ChildFailedError("train.py", {rank: pair[1] for rank, pair in pairs.items()})
    # the worker killed by a signal has no error file: its time is "now" in both; mask it
    now = re.compile(r"time      : \S+")
    assert now.sub("time", str(ours)) == now.sub("time", str(theirs))
    assert ours.get_first_failure()[0] == theirs.get_first_failure()[0] == 0
    assert "exitcode  : -9 (pid: 4003)  (SIGKILL)" in str(ours)


def test_launch_agent_rejects_what_it_cannot_run() -> None:
    config = _config(ring_api)
    with pytest.raises(ValueError, match=r"^entrypoint must be a callable or a program's path, "
                                         r"got None$"):
        ring_api.launch_agent(config, None, [])
    with pytest.raises(ValueError, match=r"^health_check_server is not supported by ringtorch's "
                                         r"launcher$"):
        ring_api.elastic_launch(config, P.fail_on_rank, health_check_server=object())(0)


def test_a_signal_to_the_launching_program_raises_signal_exception_as_torch(
        tmp_path: Path) -> None:
    outputs = {}
    for name in APIS:
        program = tmp_path / f"{name}_signalled.py"
        program.write_text(textwrap.dedent(f"""
            import os, sys, time
            from {name}.distributed.launcher.api import LaunchConfig, elastic_launch
            from {name}.distributed.elastic.multiprocessing import SignalException

            def wait_forever(marker):
                open(marker + os.environ["RANK"], "w").close()
                while True:
                    time.sleep(1)

            if __name__ == "__main__":
                config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="sig",
                                      rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                                      max_restarts=0)
                try:
                    elastic_launch(config, wait_forever)(sys.argv[1])
                except SignalException as exc:
                    print("SignalException", exc.sigval.name, flush=True)
        """))
        marker = str(tmp_path / f"{name}_started_")
        proc = subprocess.Popen([sys.executable, str(program), marker], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _wait_for_files([marker + "0", marker + "1"], proc)
        proc.terminate()
        out, err = proc.communicate(timeout=60)
        outputs[name] = (proc.returncode, out.strip().splitlines()[-1:])
    assert outputs["ringtorch"] == outputs["torch"] == (0, ["SignalException SIGTERM"])


def _wait_for_files(paths: list[str], proc: subprocess.Popen[str]) -> None:
    """Wait (bounded) until the workers have written their markers."""
    def started() -> bool:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        return all(os.path.exists(p) for p in paths)

    wait_for(started, 60, "the workers to start")


def test_a_recorded_main_reports_the_workers_error_in_its_own_error_file_as_torch(
        tmp_path: Path) -> None:
    reported = {}
    for name in APIS:
        program = tmp_path / f"{name}_recorded.py"
        program.write_text(textwrap.dedent(f"""
            from {name}.distributed.elastic.multiprocessing.errors import record
            from {name}.distributed.launcher.api import LaunchConfig, elastic_launch
            from tests.compat._elastic_programs import fail_on_rank

            @record
            def main():
                config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="rec",
                                      rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                                      max_restarts=0)
                elastic_launch(config, fail_on_rank)(1)

            if __name__ == "__main__":
                main()
        """))
        error_file = tmp_path / f"{name}_error.json"
        env = dict(os.environ, TORCHELASTIC_ERROR_FILE=str(error_file),
                   PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        out = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path, env=env)
        assert out.returncode == 1, out.stderr[-3000:]
        message = json.loads(error_file.read_text())["message"]
        reported[name] = (message["message"], message["errorCode"],
                          message["extraInfo"]["py_callstack"].strip().splitlines()[-1])
    assert reported["ringtorch"] == reported["torch"] == (
        "ValueError: bad batch on rank 1", 1, "ValueError: bad batch on rank 1")


def test_a_function_that_cannot_be_sent_is_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match=r"^elastic_launch cannot send test_a_function_that_"
                                         r"cannot_be_sent_is_refused_before_anything_starts."
                                         r"<locals>.<lambda> and its arguments to the workers: "
                                         r"Can't pickle local object .* a function typed into an "
                                         r"interactive session or a lambda is not: put it in a "
                                         r"module$"):
        ring_api.elastic_launch(_config(ring_api), lambda: 1)()


def test_a_script_that_launches_at_import_time_fails_with_the_reason(tmp_path: Path) -> None:
    program = tmp_path / "unguarded.py"
    program.write_text(textwrap.dedent("""
        from ringtorch.distributed.launcher.api import LaunchConfig, elastic_launch

        def work():
            return 1

        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="unguarded",
                              rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0)
        print(elastic_launch(config, work)())   # no `if __name__ == "__main__":`
    """))
    out = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 1
    assert "work FAILED" in out.stderr
    assert ("RuntimeError: elastic_launch was called while a worker imported the launching "
            "script: the workers import that script again to find the function, so the launch "
            "must run only under 'if __name__ == \"__main__\":'") in out.stderr


def test_fork_start_runs_a_function_that_cannot_be_pickled_as_torch(tmp_path: Path) -> None:
    outputs = {}
    for name in APIS:
        # what a notebook cell does: a closure over a local, launched at top level
        program = tmp_path / f"{name}_notebook.py"
        program.write_text(textwrap.dedent(f"""
            import torch
            import {name}.distributed as dist
            from {name}.distributed.launcher.api import LaunchConfig, elastic_launch

            def make(scale):
                def compute(x):
                    dist.init_process_group("gloo")
                    t = torch.tensor([float(dist.get_rank() + 1)]) * x * scale
                    dist.all_reduce(t)
                    dist.destroy_process_group()
                    return t.item()
                return compute

            config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="cell",
                                  rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                                  max_restarts=0, start_method="fork")
            print(sorted(elastic_launch(config, make(3.0))(2.0).items()))
            print(sorted(elastic_launch(config, lambda: "lambda ran")().items()))
        """))
        out = subprocess.run([sys.executable, str(program)], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)
        assert out.returncode == 0, out.stderr[-3000:]
        outputs[name] = out.stdout.strip().splitlines()
    assert outputs["ringtorch"] == outputs["torch"] == [
        "[(0, 18.0), (1, 18.0)]", "[(0, 'lambda ran'), (1, 'lambda ran')]"]


def test_fork_start_failure_raises_torchs_table() -> None:
    errors = {}
    for name, api in APIS.items():
        with pytest.raises((ChildFailedError, TorchChildFailed)) as info:
            api.elastic_launch(_config(api, start_method="fork"), P.fail_on_rank)(0)
        errors[name] = _table(str(info.value))
    assert errors["ringtorch"] == errors["torch"]
    assert errors["ringtorch"][-1] == "ValueError: bad batch on rank 0"


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_a_failure_stops_the_worker_still_running_as_torch(start_method: str,
                                                           tmp_path: Path) -> None:
    tables = {}
    for name, api in APIS.items():
        markers = tmp_path / name
        markers.mkdir()
        started = time.monotonic()
        with pytest.raises((ChildFailedError, TorchChildFailed)) as info:
            api.elastic_launch(_config(api, start_method=start_method),
                               P.fail_while_peer_runs)(str(markers))
        assert time.monotonic() - started < 60, name  # rank 1 was stopped, not waited for
        tables[name] = _table(str(info.value))
    assert tables["ringtorch"] == tables["torch"]
    assert "  rank      : 0 (local_rank: 0)" in tables["ringtorch"]
    assert tables["ringtorch"][-1] == "RuntimeError: rank 0 gives up"

"""A custom rendezvous backend plugs into ``elastic_launch`` and ``ringrun`` as into torch's.

The backend (tests/integration/_file_rendezvous.py) is written against
``ringtorch.distributed.elastic.rendezvous`` the way a user writes one for torch: nodes meet
in a shared file. Through the registry it drives ``elastic_launch``; through a
``torchrun.handlers`` entry point (a distribution's metadata on the path) it drives two
``ringrun`` launchers that really rendezvous and run one job. The registry's messages are
torch's, checked against torch's own registry.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.elastic.rendezvous as torch_rdzv

import ringtorch.distributed.elastic.rendezvous as rdzv
from ringtorch.distributed.launcher.api import LaunchConfig, elastic_launch
from tests.integration import _file_rendezvous as F

ROOT = Path(__file__).resolve().parents[2]


def _config(endpoint: Path, backend: str = F.BACKEND, **overrides: Any) -> LaunchConfig:
    fields: dict[str, Any] = {"min_nodes": 1, "max_nodes": 1, "nproc_per_node": 2,
                              "run_id": "job", "rdzv_backend": backend,
                              "rdzv_endpoint": str(endpoint), "max_restarts": 0}
    fields.update(overrides)
    return LaunchConfig(**fields)


def test_registered_handler_drives_elastic_launch(tmp_path: Path) -> None:
    rdzv.rendezvous_handler_registry.register(F.BACKEND, F.create_handler)
    results = elastic_launch(_config(tmp_path / "meet"), F.all_reduce_ranks)()
    assert results == {0: (0, 2, 3.0), 1: (1, 2, 3.0)}


def test_handler_timeout_reaches_the_caller_as_its_own_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGTORCH_SECRET", "s" * 64)  # a job of two nodes needs one
    rdzv.rendezvous_handler_registry.register(F.BACKEND, F.create_handler)
    config = _config(tmp_path / "meet", max_nodes=2, rdzv_configs={"timeout": 1})
    with pytest.raises(rdzv.RendezvousTimeoutError, match=r"^round 1: only 1 node\(s\) came$"):
        elastic_launch(config, F.all_reduce_ranks)()


def _broken_creator(params: rdzv.RendezvousParameters) -> rdzv.RendezvousHandler:
    raise OSError(f"cannot reach {params.endpoint}")


def test_handler_that_fails_to_build_is_reported_with_the_backend_error(tmp_path: Path) -> None:
    rdzv.rendezvous_handler_registry.register("broken", _broken_creator)
    with pytest.raises(rdzv.RendezvousError, match=r"^cannot reach nowhere:1$"):
        elastic_launch(_config(Path("nowhere:1"), backend="broken"), F.all_reduce_ranks)()


class _LeftOut(F.FileRendezvousHandler):
    def get_backend(self) -> str:
        return "leftout"

    def next_rendezvous(self) -> rdzv.RendezvousInfo:
        raise rdzv.RendezvousGracefulExitError("the job is full")


def test_a_node_the_backend_leaves_out_runs_nothing_and_succeeds(tmp_path: Path) -> None:
    rdzv.rendezvous_handler_registry.register("leftout", _LeftOut)
    assert elastic_launch(_config(tmp_path / "meet", backend="leftout"),
                          F.all_reduce_ranks)() == {}


class _NoBootstrap(F.FileRendezvousHandler):
    """A handler that leaves the workers' store to the launchers (no bootstrap_store_info)."""

    def get_backend(self) -> str:
        return "nobootstrap"

    def next_rendezvous(self) -> rdzv.RendezvousInfo:
        store, rank = self.meet()
        return rdzv.RendezvousInfo(store, rank, self.params.max_nodes, None)  # type: ignore[arg-type]


def test_without_bootstrap_info_node_zero_publishes_the_workers_store(tmp_path: Path) -> None:
    rdzv.rendezvous_handler_registry.register("nobootstrap", _NoBootstrap)
    results = elastic_launch(_config(tmp_path / "meet", backend="nobootstrap"),
                             F.all_reduce_ranks)()
    assert results == {0: (0, 2, 3.0), 1: (1, 2, 3.0)}


def _plugin_dir(tmp_path: Path) -> Path:
    """A directory holding an installed distribution's metadata that declares ``filerdzv``
    in torchrun's entry-point group."""
    info = tmp_path / "plugin" / "filerdzv_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: filerdzv-plugin\n"
                                   "Version: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[torchrun.handlers]\nfilerdzv = tests.integration._file_rendezvous:creator_factory\n")
    return info.parent


def test_ringrun_nodes_rendezvous_through_an_entry_point_backend(tmp_path: Path) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text("from tests.integration._file_rendezvous import all_reduce_ranks\n"
                      "print('result', *all_reduce_ranks(), flush=True)\n")
    env = dict(os.environ, RINGTORCH_SECRET="s" * 64,
               PYTHONPATH=os.pathsep.join([str(_plugin_dir(tmp_path)), str(ROOT)]))
    def command(nproc: int) -> list[str]:
        return [sys.executable, "-m", "ringtorch.launcher", "--nnodes", "2", "--nproc-per-node",
                str(nproc), "--rdzv-backend", F.BACKEND, "--rdzv-endpoint",
                str(tmp_path / "meet"), "--rdzv-id", "two-nodes", str(worker)]

    # nodes of different sizes: the launchers agree on the global ranks through the store
    nodes = [subprocess.Popen(command(nproc), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path)
             for nproc in (1, 2)]
    outputs = [node.communicate(timeout=120) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err
    lines = sorted(line for out, _ in outputs for line in out.splitlines()
                   if line.startswith("result"))
    assert lines == ["result 0 3 6.0", "result 1 3 6.0", "result 2 3 6.0"]


def test_ringrun_refuses_a_backend_nobody_registered(tmp_path: Path) -> None:
    script = tmp_path / "x.py"
    script.write_text("")
    out = subprocess.run([sys.executable, "-m", "ringtorch.launcher", "--rdzv-backend",
                          "nosuch", str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "ringrun: error: --rdzv-backend 'nosuch' is not supported; use one of static, c10d, or "
        "register a custom backend under that name (rendezvous_handler_registry.register, or "
        "a torchrun.handlers entry point)")


class _NamedHandler(F.FileRendezvousHandler):
    def get_backend(self) -> str:
        return "other"


def _named_creator(params: Any) -> Any:
    return _NamedHandler(params)


def _outcome(call: Any) -> tuple[str, str]:
    try:
        call()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


def _registry_cases(module: Any, tmp_path: Path) -> list[tuple[str, str]]:
    registry = module.RendezvousHandlerRegistry()
    registry.register("taken", F.create_handler)
    registry.register("renamed", _named_creator)
    params = module.RendezvousParameters
    return [
        _outcome(lambda: registry.register("", F.create_handler)),
        _outcome(lambda: registry.register("taken", F.create_handler)),
        _outcome(lambda: registry.register("taken", _named_creator)),
        _outcome(lambda: registry.create_handler(params("absent", "", "r", 1, 1))),
        _outcome(lambda: registry.create_handler(params("renamed", str(tmp_path / "f"), "r",
                                                        1, 1))),
        _outcome(lambda: params("", "", "r", 1, 1)),
        _outcome(lambda: params("b", "", "r", 0, 1)),
        _outcome(lambda: params("b", "", "r", 3, 2)),
        _outcome(lambda: params("b", "", "r", 1, 1, flag="maybe").get_as_bool("flag")),
        _outcome(lambda: params("b", "", "r", 1, 1, n="x").get_as_int("n")),
        (str(params("b", "", "r", 1, 1, flag="Yes").get_as_bool("flag")), ""),
        (str(params("b", "", "r", 1, 1, n="7").get_as_int("n")), ""),
    ]


def test_registry_and_parameters_behave_and_fail_as_torchs(tmp_path: Path) -> None:
    ours = _registry_cases(rdzv, tmp_path)
    theirs = _registry_cases(torch_rdzv, tmp_path)
    assert ours == theirs
    assert ours[3] == ("ValueError", "The rendezvous backend 'absent' is not registered. Did "
                                     "you forget to call `register`?")


def test_rendezvous_store_info_is_agreed_through_the_store(tmp_path: Path) -> None:
    from ringtorch.store import FileStore

    store = FileStore(str(tmp_path / "s"), -1)
    first = rdzv.RendezvousStoreInfo.build(0, store, "10.1.2.3", server_port=4567)
    second = rdzv.RendezvousStoreInfo.build(1, store, "ignored")
    assert first == second == rdzv.RendezvousStoreInfo("10.1.2.3", 4567)
    assert store.get("MASTER_ADDR") == b"10.1.2.3" and store.get("MASTER_PORT") == b"4567"

"""DistributedDataParallel and DataParallel on modules in device memory and RPC device maps
(the ``gpu_training`` feature): ringtorch/nn/parallel/ddp.py, reducer.py, data_parallel.py,
ringtorch/distributed/rpc/_devices.py, ringtorch/_device/place.py.

``sim`` (the simulated runtime, modules moved with ``place.to_device`` standing in for
``.to("cuda:N")``) in the default suite; the ``cuda`` twins (marked gpu(1): every rank on GPU 0)
run in the GPU check, with ``ringrun --nproc-per-node gpu`` (one worker per visible GPU,
``LOCAL_RANK`` naming its device; on CPU its refusal is tests/unit/test_run_args.py's). The feature is
opened with RINGTORCH_DEVICE_UNCONFIRMED=1 as the GPU check does. Expected parameters come from
plain torch training the same model on one process over the whole batch
(tests/integration/_gpu_training_ranks.py builds both).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from ringtorch.testing import run_ranks
from tests.integration import _gpu_training_ranks as R

# world 2: the device paths themselves are tested at worlds 2-4 (test_device_ipc.py)
WORLDS = [("sim", 2), pytest.param("cuda", 2, marks=pytest.mark.gpu(1))]
ONE = [("sim", 1), pytest.param("cuda", 1, marks=pytest.mark.gpu(1))]
ENV = {"RINGTORCH_DEVICE_UNCONFIRMED": "1"}
CLOSED = ("{what} is not available in this build of ringtorch: it has not been confirmed on a "
          "GPU yet (docs/gpu.md lists the recorded GPU runs); RINGTORCH_DEVICE_UNCONFIRMED=1 "
          "opens it for testing")


@functools.cache
def results(runtime: str, ws: int) -> list[dict]:
    return run_ranks(R.run, ws, timeout=120, env={**ENV, "RINGTORCH_DEVICE_RUNTIME": runtime})


def _single_process(ws: int) -> list[np.ndarray]:
    """The same model trained on one process over every rank's batch (mean over ranks of
    each rank's mean loss: the gradient DDP averages)."""
    net = R.model()
    opt = torch.optim.SGD(net.parameters(), lr=R.LR)
    for step in range(R.STEPS):
        opt.zero_grad()
        loss = sum(nn.functional.mse_loss(net(x), y)
                   for x, y in (R.batch(r, step) for r in range(ws))) / ws
        loss.backward()
        opt.step()
    return [p.detach().numpy() for p in net.parameters()]


@pytest.mark.parametrize(("runtime", "ws"), WORLDS)
def test_ddp_on_a_device_module_trains_like_one_process(runtime: str, ws: int) -> None:
    expected = _single_process(ws)
    for rank, res in enumerate(results(runtime, ws)):
        assert res["runtime"] == runtime
        # without a comm hook, with allreduce_hook (both over IPC), staged (RINGTORCH_DEVICE_IPC=0)
        for key in ("params", "params_hook", "params_staged"):
            for i, (got, want) in enumerate(zip(res[key], expected, strict=True)):
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{key} {i} rank {rank}")
        # several buckets, all in device memory, reduced over the device path (IPC here)
        assert len(res["on_device"]) > 1 and all(res["on_device"]), res["on_device"]
        assert res["ipc_rounds"] == R.STEPS * len(res["on_device"])  # every bucket, every step
        assert res["paths"] == ["ipc"]
        assert res["staged_path"] == "staging"


@pytest.mark.parametrize(("runtime", "ws"), WORLDS[:1])
def test_while_the_feature_is_closed_ddp_on_a_device_module_says_so(runtime: str,
                                                                    ws: int) -> None:
    for res in results(runtime, ws):
        assert res["closed"] == CLOSED.format(
            what="DistributedDataParallel on a GPU module")


@pytest.mark.parametrize(("runtime", "ws"), ONE)
def test_data_parallel_over_device_0(runtime: str, ws: int) -> None:
    res = run_ranks(R.data_parallel, ws, timeout=60,
                    env={**ENV, "RINGTORCH_DEVICE_RUNTIME": runtime})[0]
    net = R.model()
    x, y = R.batch(0, 0)
    nn.functional.mse_loss(net(x), y).backward()
    for i, (got, p) in enumerate(zip(res["grads"], net.parameters(), strict=True)):
        np.testing.assert_allclose(got, p.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{i}")
    assert res["device_ids"] == [0]
    if runtime == "sim":
        assert res["closed"] == CLOSED.format(what="DataParallel on a GPU module")
    else:  # on CUDA, DataParallel needs no device feature of ringtorch's: today's behaviour
        assert "closed" not in res


@pytest.mark.parametrize("runtime", ["sim", pytest.param("cuda", marks=pytest.mark.gpu(1))])
def test_rpc_device_map_moves_device_tensors_to_the_mapped_device(runtime: str) -> None:
    res = run_ranks(R.rpc_device_map, 3, timeout=90,
                    env={**ENV, "RINGTORCH_DEVICE_RUNTIME": runtime})
    out = res[0]
    assert out["arrived_on_device"] is True  # on worker1's cuda:0, by worker0's map
    assert out["back_on_device"] is True  # the reply: worker0's map reversed
    np.testing.assert_array_equal(out["back"], np.arange(6, dtype=np.float32) * 2)
    assert out["unmapped"] == (
        "TensorPipe RPC backend only supports CPU tensors by default, please move your tensors "
        "to CPU before sending them over RPC, or call `set_device_map` on "
        "`TensorPipeRpcBackendOptions` to explicitly configure device mapping. Request device "
        "mapping is not available for destination worker2")
    assert out["cpu"] == [2.0, 2.0]
    for rank, got in enumerate(res):
        assert got["closed"] == (
            "ringtorch RPC moves CPU tensors only: device_maps and devices must be empty (move "
            "CUDA tensors to the CPU before sending them); RPC device maps have not been "
            "confirmed on a GPU yet (docs/gpu.md), RINGTORCH_DEVICE_UNCONFIRMED=1 opens them "
            "for testing"), f"rank {rank}"
        assert got["devices"] == ("`set_devices` expect a list of CUDA devices, but got device "
                                  "type cpu."), f"rank {rank}"


GPU_WORKER = r"""
import json, os, sys
import torch
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
report = {"local_rank": local, "world_size": int(os.environ["WORLD_SIZE"]),
          "device": torch.cuda.current_device(), "count": torch.cuda.device_count()}
with open(os.path.join(sys.argv[1], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump(report, f)
"""


@pytest.mark.gpu(1)
def test_ringrun_nproc_per_node_gpu_starts_one_worker_per_visible_gpu(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(GPU_WORKER)
    env = {**os.environ}
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run([sys.executable, "-m", "ringtorch.launcher", "--nproc-per-node", "gpu",
                           str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    reports = sorted((json.loads(p.read_text()) for p in tmp_path.glob("rank*.json")),
                     key=lambda r: r["local_rank"])
    count = reports[0]["count"]
    assert [r["local_rank"] for r in reports] == list(range(count))
    assert [r["device"] for r in reports] == list(range(count))
    assert {r["world_size"] for r in reports} == {count}

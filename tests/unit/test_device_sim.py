"""What only the simulated runtime and the runtime choice do: ``runtime()`` picks by
RINGTORCH_DEVICE_RUNTIME, and every misuse of the simulated runtime fails with a message
saying what is wrong (the contract both runtimes keep is test_device_runtime.py)."""

from __future__ import annotations

import os
import re

import pytest
import torch

from ringtorch import _config
from ringtorch._device import _sim_shm, runtime
from ringtorch._device.api import IpcBuffer
from ringtorch._device.sim import SimRuntime


def test_the_knob_picks_the_runtime_and_each_is_made_once() -> None:
    with _config.override(DEVICE_RUNTIME="sim"):
        first = runtime()
        assert first.name == "sim"
        assert runtime() is first
    with _config.override(DEVICE_RUNTIME="auto"):
        assert runtime().name == ("cuda" if torch.cuda.is_available() else "sim")


def test_asking_for_cuda_without_a_gpu_is_an_error() -> None:
    with _config.override(DEVICE_RUNTIME="cuda"):
        if torch.cuda.is_available():
            assert runtime().name == "cuda"
            return
        with pytest.raises(RuntimeError, match=re.escape(
                "RINGTORCH_DEVICE_RUNTIME=cuda, but torch sees no usable CUDA device (torch "
                f"{torch.__version__}, built with CUDA: {torch.backends.cuda.is_built()})")):
            runtime()


def test_an_unknown_runtime_name_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGTORCH_DEVICE_RUNTIME", "rocm")
    with pytest.raises(ValueError, match=re.escape(
            "environment variable RINGTORCH_DEVICE_RUNTIME='rocm' is invalid: expected one of "
            "auto, cuda, sim")):
        _config.DEVICE_RUNTIME.get()


def test_only_an_interprocess_event_has_an_ipc_handle() -> None:
    rt = SimRuntime()
    with pytest.raises(RuntimeError, match="^only an event created with interprocess=True has "
                                           "an IPC handle$"):
        rt.new_event().ipc_handle()
    with pytest.raises(ValueError, match="^not an IPC handle of a simulated interprocess event$"):
        rt.open_event(b"\x00" * 64, 0)


def test_only_memory_of_empty_can_be_exported_and_only_by_its_runtime() -> None:
    rt = SimRuntime()
    with pytest.raises(ValueError, match=r"^only a tensor made by this runtime's empty\(\) can "
                                         r"be exported$"):
        rt.export(torch.zeros(4))
    with pytest.raises(ValueError, match="^cannot open a 'cuda' device buffer with the sim "
                                         "runtime$"):
        rt.open(IpcBuffer("cuda", ()))
    with pytest.raises(ValueError, match="^not a simulated device segment: '/etc/passwd'$"):
        _sim_shm.attach("/etc/passwd")


def test_an_exported_view_opens_as_that_view_and_its_segment_goes_with_the_memory() -> None:
    rt = SimRuntime()
    base = rt.empty((4, 6), torch.float64, 0)
    base.copy_(torch.arange(24, dtype=torch.float64).reshape(4, 6))
    view = base[1:, 2:5]
    buffer = rt.export(view)
    opened = rt.open(buffer)
    assert torch.equal(opened, torch.arange(24, dtype=torch.float64).reshape(4, 6)[1:, 2:5])
    opened.fill_(-1.0)  # the same memory
    assert torch.equal(view, torch.full((3, 3), -1.0, dtype=torch.float64))
    path = buffer.payload[0]
    del base
    assert os.path.exists(path)  # the name exists while any view of the memory does
    del view
    assert not os.path.exists(path)  # the exporter's memory is gone: so is the name
    assert opened.sum().item() == -9.0  # a peer's mapping stays valid


def test_a_failed_op_poisons_its_stream() -> None:
    rt = SimRuntime()
    stream = rt.new_stream(0)

    def bad() -> None:
        raise ZeroDivisionError("kernel fault")

    rt.launch(stream, bad)
    with pytest.raises(RuntimeError, match=r"^simulated device work failed on this stream: "
                                           r"ZeroDivisionError\('kernel fault'\)$"):
        stream.synchronize()

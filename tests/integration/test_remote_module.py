"""RemoteModule on 3 real RPC workers: its forward, forward_async and parameters are those of
the same module run here; it travels over RPC and drives the same module from there; a
distributed autograd step updates the remote parameters as plain torch does; errors are
torch's."""

from __future__ import annotations

import functools
import inspect

import pytest
import torch
from torch import nn
from torch.distributed.nn.api.remote_module import RemoteModule as TorchRemoteModule
from torch.distributed.nn.api.remote_module import _RemoteModule as _TorchRemoteModule

from ringtorch.distributed.nn import RemoteModule
from ringtorch.testing import run_ranks
from tests.integration import _remote_module_ranks as R


@functools.cache
def seen() -> dict:
    return run_ranks(R.scenario, 3, timeout=90)[0]


def _x() -> torch.Tensor:
    return torch.arange(8.0).reshape(2, 4) / 8


def _local() -> R.Scaled:
    return R.Scaled(4, seed=5)


def test_the_module_is_built_on_the_named_worker_with_args_and_kwargs() -> None:
    assert seen()["owner"] == "worker1"
    for got, want in zip(seen()["module"].parameters(), _local().parameters(), strict=True):
        assert torch.equal(got, want)


def test_forward_and_forward_async_give_the_local_modules_output() -> None:
    local = _local()
    with torch.no_grad():
        assert torch.equal(seen()["forward"], local(_x(), shift=0.5))
        assert torch.equal(seen()["forward_async"], local(_x(), shift=0.5))
        assert torch.equal(seen()["call"], local(_x()))


def test_remote_parameters_are_rrefs_to_the_modules_parameters() -> None:
    local = _local()
    assert seen()["param_owners"] == {"worker1"}
    for got, want in zip(seen()["params"], local.parameters(), strict=True):
        assert torch.equal(got, want)
    assert len(seen()["params"]) == 3
    (direct,) = seen()["params_direct"]  # recurse=False: only the module's own `gain`
    assert torch.equal(direct, local.gain)


def test_remote_device_forms() -> None:
    assert seen()["by_rank"] == (1, "cpu", 1)  # "rank:1/cpu"; kwargs bias=False reached it
    assert seen()["by_name"] == ("worker1", "cpu")  # a worker alone means its CPU


def test_a_remote_module_sent_over_rpc_drives_the_same_module() -> None:
    with torch.no_grad():
        want = _local()(_x(), shift=1.0)
    there = seen()["there"]
    assert torch.equal(there["out"], want)
    assert (there["on"], there["device"], there["owner"]) == ("worker1", "cpu", "worker1")
    assert torch.equal(seen()["back"], want)  # and returned to worker0, still working


def test_init_from_module_rref_shares_the_module() -> None:
    with torch.no_grad():
        assert torch.equal(seen()["shared"], _local()(_x(), shift=0.5))


def test_train_and_eval_set_the_remote_modules_mode() -> None:
    assert seen()["eval"] == (True, False, False)
    assert seen()["train"] is True


def test_a_distributed_autograd_step_updates_the_remote_parameters_as_torch() -> None:
    local = _local()
    loss = (local(_x()) * torch.arange(1.0, 5.0)).sum()
    opt = torch.optim.SGD(local.parameters(), lr=0.25)
    loss.backward()
    opt.step()
    torch.testing.assert_close(seen()["loss"], loss.detach())
    for got, want in zip(seen()["stepped"], local.parameters(), strict=True):
        torch.testing.assert_close(got, want.detach())


def test_pickling_outside_rpc_is_refused() -> None:
    name, message = seen()["pickle"]
    assert name == "RuntimeError"
    assert message.startswith("RRef can only be pickled by the RPC framework"), message


def test_a_module_cls_that_returns_no_module_fails_with_torchs_message() -> None:
    name, message = seen()["not_a_module"]
    assert name == "ValueError"
    assert ("Expect `module_cls(*args, **kwargs)` returns an instance of <class nn.Module>, "
            "but it returns an instance of <class 'int'>.") in message


def test_an_unknown_worker_is_refused_at_construction() -> None:
    name, message = seen()["unknown_worker"]
    assert name == "RuntimeError"
    assert message == ("unknown destination worker 'nobody': the workers of this RPC group "
                       "are ['worker0', 'worker1', 'worker2']")


def test_a_remote_device_string_torch_cannot_parse_is_refused_with_its_message() -> None:
    assert seen()["bad_string"] == (
        "ValueError", "Could not parse remote_device: a/b/c. The valid format is "
                      "'<workername>/<device>' or 'rank:<rank>/<device>' or '<device>'")


def test_a_remote_device_naming_no_worker_is_refused() -> None:
    assert seen()["no_worker"] == (
        "ValueError", "RemoteModule needs a worker in remote_device: '<worker>/cpu' or "
                      "'rank:<rank>/cpu', got 'cpu'")


def test_a_cuda_device_is_refused() -> None:
    assert seen()["cuda"] == (
        "ValueError", "RemoteModule cannot place a module on cuda:0 ('worker1/cuda:0'): "
                      "ringtorch's RPC moves CPU tensors only; use '<worker>/cpu'")


def test_torchscript_interfaces_are_refused() -> None:
    assert seen()["interface"] == (
        "ValueError", "TorchScript RemoteModules (_module_interface_cls) are not supported by "
                      "ringtorch")


def test_without_rpc_it_fails_as_torch() -> None:
    with pytest.raises(AssertionError, match=r"^RemoteModule only works in RPC\.$"):
        RemoteModule("worker1/cpu", nn.Linear, args=(2, 2))


def _refused_by_torch() -> list[str]:
    """The methods torch's RemoteModule refuses with ``_raise_not_supported``, read from its
    source."""
    return sorted(name for name, fn in vars(_TorchRemoteModule).items()
                  if inspect.isfunction(fn) and "_raise_not_supported(" in inspect.getsource(fn))


def _bare(cls: type) -> nn.Module:
    module = cls.__new__(cls)  # no RPC needed to reach the refusals
    nn.Module.__init__(module)
    return module


def _error(cls: type, name: str) -> tuple[str, str]:
    needed = [p for p in inspect.signature(getattr(TorchRemoteModule, name)).parameters.values()
              if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD][1:]  # not self
    try:
        getattr(_bare(cls), name)(*[None] * len(needed))
    except ValueError as exc:
        return "ValueError", str(exc)
    return "", ""


def test_the_same_methods_as_torchs_are_refused() -> None:
    assert len(_refused_by_torch()) >= 30
    for name in _refused_by_torch():
        assert getattr(RemoteModule, name) is not getattr(nn.Module, name), name


@pytest.mark.parametrize("name", _refused_by_torch() + ["parameters"])
def test_methods_needing_the_module_here_raise_torchs_error(name: str) -> None:
    theirs = _error(TorchRemoteModule, name)
    assert theirs[0] == "ValueError"
    assert _error(RemoteModule, name) == theirs


def test_parameters_points_to_remote_parameters() -> None:
    module = RemoteModule.__new__(RemoteModule)
    nn.Module.__init__(module)
    with pytest.raises(ValueError, match=r"^Method ``parameters`` not supported for "
                                         r"RemoteModule\. Please use ``remote_parameters`` "
                                         r"instead\.$"):
        module.parameters()

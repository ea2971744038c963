"""DataParallel: without CUDA the module runs as it is (torch's behaviour); over CPU replicas,
asked for with ``cpu_replicas``, outputs and gradients equal one module on the whole batch."""

from __future__ import annotations

import copy
import re
from collections import namedtuple

import pytest
import torch
from torch import nn

from ringtorch.nn import DataParallel
from ringtorch.nn.parallel import data_parallel, gather, scatter

Pair = namedtuple("Pair", "a b")


def _mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _grads(module: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in module.parameters()]


@pytest.mark.parametrize("replicas,batch", [(2, 8), (3, 8), (2, 5), (4, 3)])
def test_output_and_gradients_equal_one_module_on_the_whole_batch(replicas, batch):
    reference = _mlp()
    parallel = DataParallel(copy.deepcopy(reference), cpu_replicas=replicas)
    x = torch.randn(batch, 6)
    target = torch.randn(batch, 3)
    expected = reference(x)
    nn.functional.mse_loss(expected, target).backward()
    out = parallel(x)
    nn.functional.mse_loss(out, target).backward()
    torch.testing.assert_close(out, expected)
    for ours, theirs in zip(_grads(parallel.module), _grads(reference), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_several_sgd_steps_track_single_module_training():
    reference = _mlp(1)
    parallel = DataParallel(copy.deepcopy(reference), cpu_replicas=3)
    torch.manual_seed(5)
    for _ in range(5):
        x, y = torch.randn(12, 6), torch.randn(12, 3)
        for model in (reference, parallel):
            model.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(p.grad, alpha=-0.1)
    for ours, theirs in zip(parallel.module.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_nested_inputs_and_kwargs_are_scattered_and_other_objects_shared():
    seen = []

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))

        def forward(self, pair, *, scale, tag):
            seen.append((pair.a.shape[0], pair.b["x"].shape[0], tag))
            return pair.a * self.w * scale + pair.b["x"]

    parallel = DataParallel(Probe(), cpu_replicas=2)
    a, bx, scale = torch.arange(4.0), torch.full((4,), 10.0), torch.tensor([1.0, 1.0, 2.0, 2.0])
    out = parallel(Pair(a, {"x": bx}), scale=scale, tag="t")
    torch.testing.assert_close(out, a * scale + bx)
    assert sorted(seen) == [(2, 2, "t"), (2, 2, "t")]


def test_replica_zero_updates_the_original_buffers():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(3)
    parallel = DataParallel(bn, cpu_replicas=2)
    x = torch.randn(8, 3)
    parallel(x)
    expected = nn.BatchNorm1d(3)
    expected(x[:4])  # replica 0 saw the first chunk
    torch.testing.assert_close(bn.running_mean, expected.running_mean)
    assert int(bn.num_batches_tracked) == 1


def test_scalar_outputs_are_gathered_into_a_vector_with_torchs_warning():
    class Loss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.tensor(2.0))

        def forward(self, x):
            return (x * self.w).sum()

    parallel = DataParallel(Loss(), cpu_replicas=2)
    with pytest.warns(UserWarning, match=r"^Was asked to gather along dimension 0, but all input "
                                         r"tensors were scalars; will instead unsqueeze and "
                                         r"return a vector\.$"):
        out = parallel(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    torch.testing.assert_close(out, torch.tensor([6.0, 14.0]))
    out.sum().backward()
    torch.testing.assert_close(parallel.module.w.grad, torch.tensor(10.0))


def test_an_exception_in_a_replica_is_raised_with_its_type_and_replica():
    class Fails(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(()))

        def forward(self, x):
            if x[0] > 1:
                raise KeyError("second half")
            return x * self.w

    with pytest.raises(KeyError, match=r"Caught KeyError in replica 1 on device cpu"):
        DataParallel(Fails(), cpu_replicas=2)(torch.arange(4.0))


def test_a_module_on_another_device_is_rejected():
    module = nn.Linear(2, 2, device="meta")
    with pytest.raises(RuntimeError, match=r"^module must have its parameters and buffers on "
                                           r"device cpu \(device_ids\[0\]\) but found one of them "
                                           r"on device: meta$"):
        DataParallel(module, cpu_replicas=2)(torch.ones(2, 2))


def test_state_dict_keys_gain_the_module_prefix():
    parallel = DataParallel(nn.Linear(2, 2), cpu_replicas=2)
    assert list(parallel.state_dict()) == ["module.weight", "module.bias"]


class _Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append(x.shape[0])
        return self.linear(x)


@pytest.mark.parametrize("device_ids", [None, [0, 1]])
def test_without_cuda_the_module_runs_as_it_is_like_torch(device_ids):
    ours, theirs = _Counting(), _Counting()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(6, 2)
    out = DataParallel(ours, device_ids=device_ids)(x)
    expected = torch.nn.DataParallel(theirs, device_ids=device_ids)(x)
    torch.testing.assert_close(out, expected)
    assert ours.batches == theirs.batches == [6]  # one call on the whole batch: no split
    assert DataParallel(ours, device_ids=device_ids).device_ids == \
        torch.nn.DataParallel(theirs, device_ids=device_ids).device_ids == []


def test_the_functional_form_without_cuda_raises_torchs_error():
    module, x = _mlp(), torch.randn(4, 6)
    for function in (data_parallel, torch.nn.parallel.data_parallel):
        with pytest.raises(RuntimeError, match=r"^device type could not be determined$"):
            function(module, x)


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "2"])
def test_cpu_replicas_must_be_a_positive_int(bad):
    message = rf"^cpu_replicas must be a positive number of replicas, got {re.escape(repr(bad))}$"
    with pytest.raises(ValueError, match=message):
        DataParallel(_mlp(), cpu_replicas=bad)
    with pytest.raises(ValueError, match=message):
        data_parallel(_mlp(), torch.randn(4, 6), cpu_replicas=bad)


def test_cpu_replicas_and_device_ids_cannot_be_combined():
    with pytest.raises(ValueError, match=r"^pass either device_ids \(CUDA devices\) or "
                                         r"cpu_replicas \(replicas on the CPU\), not both$"):
        DataParallel(_mlp(), device_ids=[0, 1], cpu_replicas=2)


def test_cpu_replicas_are_refused_where_cuda_is_available(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ValueError, match=r"^cpu_replicas splits the batch over CPU replicas on a "
                                         r"machine without CUDA; here CUDA is available: pass "
                                         r"device_ids to use the GPUs$"):
        DataParallel(_mlp(), cpu_replicas=2)


def test_empty_device_ids_run_the_module_itself():
    module = _mlp()
    x = torch.randn(4, 6)
    torch.testing.assert_close(DataParallel(module, device_ids=[])(x), module(x))


def test_no_grad_forward_builds_no_graph():
    parallel = DataParallel(_mlp(), cpu_replicas=2)
    with torch.no_grad():
        out = parallel(torch.randn(4, 6))
    assert out.grad_fn is None and not out.requires_grad


def test_functional_form_and_helpers_match_the_module():
    module = _mlp()
    x = torch.randn(6, 6)
    torch.testing.assert_close(data_parallel(module, x, cpu_replicas=3), module(x))
    chunks = scatter(x, [0, 1, 2])
    assert [c.shape[0] for c in chunks] == [2, 2, 2]
    torch.testing.assert_close(gather(list(chunks), "cpu"), x)

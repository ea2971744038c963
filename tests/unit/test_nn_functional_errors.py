"""The errors ringtorch.distributed.nn.functional raises before anything is sent."""

from __future__ import annotations

import pytest
import torch

import ringtorch.distributed.nn.functional as F


def test_scatter_of_tensors_of_different_shapes_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^scatter needs tensors of one shape, got "
                                         r"\[\(2,\), \(3,\)\]$"):
        F.scatter([torch.zeros(2), torch.zeros(3)], src=0)


def _z() -> torch.Tensor:
    return torch.zeros(1)


CALLS = {
    "broadcast": lambda: F.broadcast(_z(), 0),
    "gather": lambda: F.gather(_z()),
    "scatter": lambda: F.scatter([_z()]),
    "reduce": lambda: F.reduce(_z(), 0),
    "reduce_scatter": lambda: F.reduce_scatter(_z(), [_z()]),
    "all_gather": lambda: F.all_gather(_z()),
    "all_to_all": lambda: F.all_to_all([_z()], [_z()]),
    "all_to_all_single": lambda: F.all_to_all_single(_z(), _z()),
    "all_reduce": lambda: F.all_reduce(_z()),
}


def test_every_function_is_checked_here() -> None:
    assert sorted(CALLS) == sorted(F.__all__)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_function_refuses_to_run_under_torch_compile(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    with pytest.raises(RuntimeError, match=rf"^ringtorch\.distributed\.nn\.functional\.{name} "
                                           rf"is not supported under torch\.compile\.$"):
        CALLS[name]()

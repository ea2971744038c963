"""ZeroRedundancyOptimizer rejects bad arguments with torch's exceptions and messages.

The argument checks run before the optimizer touches its process group, so both torch's
class and ringtorch's are built here, in the test process: torch's message is the expected one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed.optim as torch_optim
from torch.distributed.optim.zero_redundancy_optimizer import _ZeROJoinHook as TorchHook

from ringtorch.distributed.optim import ZeroRedundancyOptimizer
from ringtorch.distributed.optim.zero_redundancy_optimizer import _ZeROJoinHook

BAD_PARAMS: dict[str, Callable[[], Any]] = {
    "a-tensor": lambda: torch.zeros(3, requires_grad=True),
    "not-iterable": lambda: 3,
    "empty": lambda: [],
    "tensors-and-dicts": lambda: [torch.zeros(2), {"params": [torch.zeros(2)]}],
    "group-without-params": lambda: [{"lr": 0.1}],
    "two-dense-types": lambda: [torch.zeros(2), torch.zeros(2, dtype=torch.float64)],
    "sparse": lambda: [torch.zeros(2).to_sparse()],
}


def _torch_error(fn: Callable[[], Any]) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as info:
        fn()
    return info.type, str(info.value)


@pytest.mark.parametrize("case", list(BAD_PARAMS))
def test_bad_params_raise_torchs_error(case: str) -> None:
    kind, message = _torch_error(lambda: torch_optim.ZeroRedundancyOptimizer(
        BAD_PARAMS[case](), torch.optim.SGD, lr=0.1))
    with pytest.raises(kind, match=f"^{re.escape(message)}$"):
        ZeroRedundancyOptimizer(BAD_PARAMS[case](), torch.optim.SGD, lr=0.1)


def test_join_hook_of_something_else_raises_torchs_error() -> None:
    kind, message = _torch_error(lambda: TorchHook(object()))
    with pytest.raises(kind, match=f"^{re.escape(message)}$"):
        _ZeROJoinHook(object())  # type: ignore[arg-type]


def test_overlap_with_ddp_is_refused_naming_what_to_use_instead() -> None:
    with pytest.raises(NotImplementedError, match=(
            r"^ZeroRedundancyOptimizer\(overlap_with_ddp=True\) is not supported by ringtorch "
            r"\(it needs torch's ddp_zero_hook communication hooks\); pass "
            r"overlap_with_ddp=False and call step\(\) after backward\(\), with "
            r"parameters_as_bucket_view=True to broadcast each shard as one tensor$")):
        ZeroRedundancyOptimizer([torch.zeros(2, requires_grad=True)], torch.optim.SGD,
                                overlap_with_ddp=True, lr=0.1)
